"""The startup heap frozen out of the garbage collector (``server.gc_freeze``) vs left in it.

    python -m bench.gc_bench                      # 200,000 messages, 2 rounds (~4 minutes)
    python -m bench.gc_bench --messages 2000 --seconds 0.5 --rounds 1 --json out.json

Each round starts one ``halfmoon serve`` (async flush) per variant, the
variants alternating so the machine's drift hits both: **frozen** (the
default: the server collects once when ready and freezes what exists) and
its peer, **untouched** (``server.gc_freeze=false``: CPython's collector as
it comes). On each server, in order:

- batched sends: ``messages`` of 256 B to a 4-queue topic through the
  project's ``SyncProducer``, 1,000 per request;
- BulkRead: the same messages read back by the project's ``PullConsumer``;
- single-message sends: 16 raw-gRPC producers, one message per request, for
  ``seconds``; then 32 messages per request for half as long.

Printed per row: messages per second and the server's CPU per message (user +
system from ``/proc``), with the frozen/untouched ratio of the CPU (< 1: the
frozen server spent less). Analysis: docs/benchmarks.md, "The garbage
collector and the startup heap".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.cluster_bench import cpu_seconds
from bench.halfmoon_peer import GrpcPeer
from bench.server_proc import HalfmoonServer
from bench.spark_bench import client_read, fill

VARIANTS = {
    "frozen": (),
    "untouched": ("server.gc_freeze=false",),
}
ROWS = ("batched send", "BulkRead", "single sends, 16 producers", "sends of 32, 16 producers")


@dataclass
class Row:
    variant: str
    row: str
    round: int
    messages: int
    seconds: float
    server_cpu_us: float  # per message

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


async def _sends(server: HalfmoonServer, batch: int, seconds: float) -> tuple[int, float, float]:
    peer = GrpcPeer(server, f"gc-{batch}")
    try:
        before = cpu_seconds(server.pid)
        done = await peer.produce(16, batch, seconds)
        return done.messages, done.seconds, cpu_seconds(server.pid) - before
    finally:
        await peer.close()


def run_variant(variant: str, round_: int, messages: int, seconds: float) -> list[Row]:
    rows: list[Row] = []
    with HalfmoonServer(flush="async", settings=VARIANTS[variant]) as server:
        server.create_topic("gc-bench", queues=4)
        cpu, began = cpu_seconds(server.pid), time.perf_counter()
        fill(server.grpc, "gc-bench", messages, 256)
        elapsed, used = time.perf_counter() - began, cpu_seconds(server.pid) - cpu
        rows.append(Row(variant, ROWS[0], round_, messages, elapsed, used / messages * 1e6))
        cpu = cpu_seconds(server.pid)
        read = asyncio.run(client_read(server.grpc, "gc-bench", messages))
        used = cpu_seconds(server.pid) - cpu
        rows.append(
            Row(variant, ROWS[1], round_, read.messages, read.seconds, used / messages * 1e6)
        )
        for name, batch, secs in ((ROWS[2], 1, seconds), (ROWS[3], 32, seconds / 2)):
            count, took, used = asyncio.run(_sends(server, batch, secs))
            rows.append(Row(variant, name, round_, count, took, used / max(count, 1) * 1e6))
    return rows


def report(rows: list[Row], out: object = sys.stdout) -> None:
    print(f"{'row':28s} {'variant':10s} {'msgs/s':>18s} {'server CPU us/msg':>20s}", file=out)
    for name in ROWS:
        cpu: dict[str, list[float]] = {}
        for variant in VARIANTS:
            mine = [r for r in rows if r.row == name and r.variant == variant]
            cpu[variant] = [r.server_cpu_us for r in mine]
            rates = [r.per_second for r in mine]
            print(
                f"{name:28s} {variant:10s} {min(rates):8,.0f}–{max(rates):<8,.0f} "
                f"{min(cpu[variant]):9.1f}–{max(cpu[variant]):<9.1f}",
                file=out,
            )
        ratio = statistics.mean(cpu["frozen"]) / statistics.mean(cpu["untouched"])
        print(f"{'':28s} frozen/untouched server CPU per message: {ratio:.2f}", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gc_bench", description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=6.0, help="single-send run length")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows: list[Row] = []
    for round_ in range(1, args.rounds + 1):
        for variant in VARIANTS:
            rows += run_variant(variant, round_, args.messages, args.seconds)
            print(f"round {round_} {variant}: done", flush=True)
    report(rows)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": [asdict(r) for r in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
