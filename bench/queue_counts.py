"""What a queue's counts cost with many messages unacked: the AMQP endpoint asks for them at
every Basic.Get (GetOk's message count), every Queue.Declare and every publish to a
length-limited queue.

    python -m bench.queue_counts                      # 100 to 60,000 in flight
    python -m bench.queue_counts --in-flight 1000 20000 --requeued 50

An in-process broker (memory store) holds one queue with ``in-flight`` messages delivered
and unacked (hidden for 30 minutes, AMQP's consumer timeout) and ``requeued`` of them
nacked back (visible again). Timed: ``Broker.group_progress`` of the queue (what
``Queue.Declare``'s message count and ``GetOk`` read), median of ``--repeat`` calls; beside
it, the peer: the same two counts (ready again, past the first delivery) by a walk of every
in-flight entry, which is what the broker did before. Both must agree.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from halfmoon.broker.broker import Broker
from halfmoon.broker.clock import FakeClock
from halfmoon.broker.config import BrokerConfig
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import OutgoingMessage
from halfmoon.store.memory import MemoryStore

HIDDEN_MS = 30 * 60 * 1000
QUEUE = "orders"


def _median_us(call: object, repeat: int) -> float:
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()  # type: ignore[operator]
        timings.append((time.perf_counter() - started) * 1e6)
    return statistics.median(timings)


def measure(in_flight: int, requeued: int, repeat: int) -> dict[str, float]:
    clock = FakeClock()
    with tempfile.TemporaryDirectory() as meta:
        broker = Broker(MemoryStore(clock.now_ms), Path(meta), BrokerConfig(), clock)
        try:
            broker.create_topic(QUEUE, queue_count=1)
            broker.create_group(QUEUE, consume_from="earliest")
            for start in range(0, in_flight, 1000):
                count = min(1000, in_flight - start)
                broker.send([OutgoingMessage(topic=QUEUE, body=b"x") for _ in range(count)])
            handles = []
            while len(handles) < in_flight:
                got = broker.receive(QUEUE, QUEUE, FilterSpec(), 1000, HIDDEN_MS)
                handles += [m.receipt_handle for m in got]
            for handle in handles[:requeued]:  # a nack with requeue: visible again at once
                broker.change_invisible_duration(QUEUE, QUEUE, handle, 0)
            (progress,) = broker.group_progress(QUEUE, QUEUE)
            state = broker._pop.states.table[(QUEUE, QUEUE)]  # noqa: SLF001 - the peer's walk
            queue = state.queues[0]
            now = clock.now_ms()

            def walk() -> tuple[int, int]:
                with state.lock:
                    entries = queue.inflight.values()
                    visible = sum(1 for e in entries if e.visible_at <= now)
                    retrying = sum(1 for e in entries if e.attempt > 1)
                return visible, retrying

            visible, retrying = walk()
            assert progress.ready == visible and progress.retrying == retrying, (progress, visible)
            assert progress.inflight == in_flight
            return {
                "in_flight": in_flight,
                "ready": progress.ready,
                "group_progress_us": _median_us(
                    lambda: broker.group_progress(QUEUE, QUEUE), repeat
                ),
                "walk_us": _median_us(walk, repeat),
            }
        finally:
            broker.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--in-flight", type=int, nargs="+", default=[100, 1_000, 10_000, 60_000])
    parser.add_argument("--requeued", type=int, default=10, help="of them, nacked back")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args(argv)
    print("| in flight | ready | group_progress (µs) | peer: walk of every entry (µs) | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for count in args.in_flight:
        row = measure(count, min(args.requeued, count), args.repeat)
        ratio = row["group_progress_us"] / row["walk_us"] if row["walk_us"] else 0.0
        print(
            f"| {count:,} | {row['ready']:,} | {row['group_progress_us']:.1f} | "
            f"{row['walk_us']:.1f} | {ratio:.2f}× |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
