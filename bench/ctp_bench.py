"""Consume-transform-produce throughput: transactions of 1, 10 and 100 messages vs plain acks.

    python -m bench.ctp_bench                  # 4,000 messages per scenario, 8 workers, sync flush
    python -m bench.ctp_bench --quick          # 600 messages per scenario
    python -m bench.ctp_bench --messages 200 --rounds 1 --json out.json

One ``halfmoon serve`` on loopback (``--flush sync`` by default: a commit is
answered once durable), driven from this process by ``--workers`` concurrent
loops of halfmoon's Python client, each with its own SimpleConsumer. Every
scenario reads its own input topic, filled beforehand with ``--messages``
1 KiB messages, and writes one transformed message per input:

- **plain** (at-least-once): receive up to 10, then for each message send
  the output (a normal topic) and ack the input;
- **tx N** (exactly once): receive up to N, then in one
  ``consumer.transaction(producer)``, for each message send the output (a
  half message of the group) and ack the input (registered with the group),
  then commit.

The loop shape is the same on both sides: one send and one ack RPC per
message, one at a time; the transactions add the commit (one per N messages)
and store the outputs twice (half, then the committed message). Rounds
alternate the scenarios so load drift hits all alike; the best round of
each is reported. Server CPU per message is the server process's user +
system time (``/proc/<pid>/stat``) over the scenario, divided by messages.

Target (issue 16): tx 10 ≥ 0.5 × plain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.load import machine_info
from bench.server_proc import Flush, HalfmoonServer
from halfmoon.client import (
    Message,
    MessageSelector,
    Producer,
    SimpleConsumer,
    TransactionProducer,
)

BODY = os.urandom(1024)
PLAIN_BATCH = 10
INVISIBLE = 60.0
TARGET_SIZE, TARGET_RATIO = 10, 0.5
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (fields 14 and 15 of /proc/pid/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


@dataclass
class Result:
    scenario: str
    messages: int
    seconds: float
    msgs_per_s: float
    server_cpu_us_per_msg: float
    ratio_to_plain: float = 0.0


async def fill(server: HalfmoonServer, topic: str, count: int) -> None:
    async with Producer(server.grpc) as producer:
        for start in range(0, count, 256):
            await producer.send_batch(
                [Message(topic, BODY) for _ in range(start, min(start + 256, count))]
            )


async def run_scenario(
    server: HalfmoonServer, name: str, size: int, messages: int, workers: int, round_no: int
) -> Result:
    source, sink, group = f"in-{name}-{round_no}", f"out-{name}-{round_no}", f"g-{name}-{round_no}"
    server.create_topic(source, queues=8)
    server.create_topic(sink, queues=8, message_type="normal" if size == 0 else "transaction")
    server.create_group(group)
    await fill(server, source, messages)
    done = 0
    producer: Producer = (
        Producer(server.grpc) if size == 0 else TransactionProducer(server.grpc, f"pg-{name}")
    )
    consumers = [
        SimpleConsumer(server.grpc, group, {source: MessageSelector.all()}) for _ in range(workers)
    ]
    await producer.start()
    for consumer in consumers:
        await consumer.start()

    async def loop(consumer: SimpleConsumer) -> None:
        nonlocal done
        while done < messages:
            received = await consumer.receive(size or PLAIN_BATCH, INVISIBLE, wait=0.2)
            if not received:
                continue
            if size == 0:
                for message in received:
                    await producer.send(Message(sink, message.body[::-1]))
                    await consumer.ack(message)
            else:
                assert isinstance(producer, TransactionProducer)
                async with consumer.transaction(producer) as tx:
                    for message in received:
                        await tx.send(Message(sink, message.body[::-1]))
                        await tx.ack(message)
            done += len(received)

    cpu_before, started = cpu_seconds(server.pid), time.perf_counter()
    await asyncio.gather(*(loop(c) for c in consumers))
    seconds = time.perf_counter() - started
    cpu = cpu_seconds(server.pid) - cpu_before
    for consumer in consumers:
        await consumer.close()
    await producer.close()
    return Result(name, done, seconds, done / seconds, cpu / done * 1e6)


def report(results: list[Result], out: object = sys.stdout) -> bool:
    best: dict[str, Result] = {}
    for r in results:
        if r.scenario not in best or r.msgs_per_s > best[r.scenario].msgs_per_s:
            best[r.scenario] = r
    plain = best["plain"].msgs_per_s
    print(f"{'scenario':<10} {'msgs/s':>9} {'x plain':>8} {'server CPU us/msg':>18}", file=out)
    for r in best.values():
        r.ratio_to_plain = r.msgs_per_s / plain
        print(
            f"{r.scenario:<10} {r.msgs_per_s:>9.0f} {r.ratio_to_plain:>8.2f} "
            f"{r.server_cpu_us_per_msg:>18.0f}",
            file=out,
        )
    ratio = best[f"tx{TARGET_SIZE}"].ratio_to_plain
    passed = ratio >= TARGET_RATIO
    verdict = "PASS" if passed else "MISS"
    print(f"target: tx {TARGET_SIZE} >= {TARGET_RATIO} x plain: {ratio:.2f} {verdict}", file=out)
    return passed


async def main_async(args: argparse.Namespace) -> list[Result]:
    sizes = {"plain": 0, "tx1": 1, "tx10": 10, "tx100": 100}
    if args.only:
        sizes = {name: sizes[name] for name in args.only}
    results: list[Result] = []
    flush: Flush = args.flush
    with HalfmoonServer(flush=flush) as server:
        for round_no in range(args.rounds):
            order = list(sizes) if round_no % 2 == 0 else list(reversed(sizes))
            for name in order:
                result = await run_scenario(
                    server, name, sizes[name], args.messages, args.workers, round_no
                )
                print(
                    f"round {round_no + 1} {name}: {result.msgs_per_s:.0f} msgs/s", file=sys.stderr
                )
                results.append(result)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=4000, help="per scenario and round")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--flush", choices=("sync", "async"), default="sync")
    parser.add_argument("--quick", action="store_true", help="600 messages, one round")
    parser.add_argument(
        "--only", nargs="+", choices=("plain", "tx1", "tx10", "tx100"), help="(profiling)"
    )
    parser.add_argument("--json", type=Path, help="write every result and the machine here")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.rounds = 600, 1
    results = asyncio.run(main_async(args))
    print(f"{args.messages} messages per scenario, {args.workers} workers, flush {args.flush}")
    if args.only and "plain" not in args.only:
        for r in results:
            print(f"{r.scenario}: {r.msgs_per_s:.0f} msgs/s, {r.server_cpu_us_per_msg:.0f} us/msg")
        return 0
    passed = report(results)
    if args.json is not None:
        document = {
            "machine": machine_info(),
            "results": [asdict(r) for r in results],
            "passed": passed,
        }
        args.json.write_text(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
