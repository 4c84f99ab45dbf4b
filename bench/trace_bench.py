"""What the message trace costs: batched sends and receive + ack, on a topic with trace on
beside one with trace off, in the same ``halfmoon serve`` in the same run.

The untraced topic is the peer: both topics live in one server process, and each
round runs both in alternating order (neither always warmer). A round:

* produce: ``--producers`` concurrent producers send batches of 32 messages of 1 KiB
  (raw gRPC SendMessage) for ``--seconds``;
* consume: ``--messages`` pre-sent messages are received (batches of 32) and acked
  (one AckMessage per batch) by 4 consumers; the fill is not measured.

The table shows messages per second, the server's CPU per message (from /proc,
the whole process: the tick thread that writes the trace included) and the
ratios traced / untraced. A send records no trace event (the stored message is
its own record), so produce should be ~1.0; a receive + ack records two.

    .venv/bin/python -m bench.trace_bench                    # 3 rounds, async flush
    .venv/bin/python -m bench.trace_bench --flush sync --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass

from bench.cluster_bench import cpu_seconds
from bench.halfmoon_peer import RECEIVE_BATCH, GrpcPeer
from bench.server_proc import HalfmoonServer

CONSUMERS = 4
MODES = ("trace on", "trace off")


@dataclass
class Sample:
    messages: int = 0
    seconds: float = 0.0
    cpu: float = 0.0

    def add(self, messages: int, seconds: float, cpu: float) -> None:
        self.messages += messages
        self.seconds += seconds
        self.cpu += cpu

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    @property
    def cpu_us(self) -> float:
        return self.cpu / self.messages * 1e6 if self.messages else 0.0


class TracePeer(GrpcPeer):
    """GrpcPeer whose fresh topics have the trace switch set as asked."""

    def __init__(self, server: HalfmoonServer, name: str, trace: bool) -> None:
        super().__init__(server, name)
        self.trace = trace

    def _fresh_topic(self, what: str) -> str:
        topic = super()._fresh_topic(what)
        self._server.admin_call("PATCH", f"/v1/topics/{topic}", {"trace": self.trace})
        return topic


async def produce(peer: TracePeer, pid: int, producers: int, seconds: float) -> tuple:
    before = cpu_seconds(pid)
    result = await peer.produce(producers, 32, seconds)
    return result.messages, result.seconds, cpu_seconds(pid) - before


async def consume(peer: TracePeer, pid: int, messages: int) -> tuple:
    topic, group = peer._fresh_topic("consume"), peer._fresh_group("consume")
    await peer._fill(topic, messages)
    acked = 0
    done = asyncio.Event()

    async def consumer() -> None:
        nonlocal acked
        while not done.is_set():
            got = await peer._receive(group, topic, RECEIVE_BATCH, 1.0)
            if got:
                await peer._ack(group, topic, got)
                acked += len(got)
                if acked >= messages:
                    done.set()

    before, started = cpu_seconds(pid), time.perf_counter()
    tasks = [asyncio.create_task(consumer()) for _ in range(CONSUMERS)]
    try:
        await asyncio.wait_for(done.wait(), timeout=max(60.0, messages / 200))
    finally:
        elapsed = time.perf_counter() - started
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0.3)  # the tick that writes the last trace events, counted too
    return acked, elapsed, cpu_seconds(pid) - before


async def run(args: argparse.Namespace) -> dict[tuple[str, str], Sample]:
    totals = {(phase, mode): Sample() for phase in ("produce", "consume") for mode in MODES}
    with HalfmoonServer(flush=args.flush) as server:
        peers = {
            "trace on": TracePeer(server, "traced", True),
            "trace off": TracePeer(server, "untraced", False),
        }
        try:
            await peers["trace off"].produce(args.producers, 32, 1.0)  # warm up
            for round_index in range(args.rounds):
                order = MODES if round_index % 2 == 0 else tuple(reversed(MODES))
                for mode in order:
                    totals[("produce", mode)].add(
                        *await produce(peers[mode], server.pid, args.producers, args.seconds)
                    )
                for mode in order:
                    totals[("consume", mode)].add(
                        *await consume(peers[mode], server.pid, args.messages)
                    )
        finally:
            for peer in peers.values():
                await peer.close()
    return totals


def report(totals: dict[tuple[str, str], Sample], args: argparse.Namespace) -> str:
    lines = [
        f"flush {args.flush}, {args.rounds} rounds: produce {args.producers} producers x "
        f"batches of 32 x {args.seconds:g} s; consume {args.messages} messages, "
        f"{CONSUMERS} consumers; 1 KiB bodies",
        f"{'phase':<8} {'topic':<10} {'msg/s':>9} {'ratio':>6} {'cpu us/msg':>11} {'ratio':>6}",
    ]
    for phase in ("produce", "consume"):
        base = totals[(phase, "trace off")]
        for mode in MODES:
            sample = totals[(phase, mode)]
            rate_ratio = sample.rate / base.rate if base.rate else 0.0
            cpu_ratio = sample.cpu_us / base.cpu_us if base.cpu_us else 0.0
            lines.append(
                f"{phase:<8} {mode:<10} {sample.rate:>9.0f} {rate_ratio:>6.2f} "
                f"{sample.cpu_us:>11.1f} {cpu_ratio:>6.2f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--producers", type=int, default=16)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--flush", choices=("async", "sync"), default="async")
    args = parser.parse_args(argv)
    print(report(asyncio.run(run(args)), args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
