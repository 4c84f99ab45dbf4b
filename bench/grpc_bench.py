"""The messaging endpoint benchmark: ``halfmoon serve`` over gRPC beside RabbitMQ.

    python -m bench.grpc_bench              # full run (about 1.5 minutes on 2 cores)
    python -m bench.grpc_bench --quick      # a short run
    python -m bench.grpc_bench --json out.json --seconds 0.2 --latency-count 30 --consume-messages
300

Every scenario runs on halfmoon and on RabbitMQ in the same run, on this
machine, with 1 KiB bodies, from this one Python process (so both systems
pay the same client-side costs and share the same clock):

* produce throughput: 1, 16 and 64 concurrent producers, batches of 1 and 32
  (halfmoon: SendMessageRequest with 1 or 32 entries on a raw gRPC channel;
  RabbitMQ: 1 or 32 confirmed persistent publishes awaited together), for a
  fixed time each; plus the official ``rocketmq.Producer`` (one message per
  send, concurrent threads) to show the client's own overhead;
* send latency p50/p99: one producer, one message at a time;
* end-to-end latency p50/p99: send → seen by a long-polling consumer
  (ReceiveMessage / basic_consume), one message in flight;
* server CPU per message in the throughput rows: user + system time of the
  server process (``/proc/<pid>/stat``; RabbitMQ's ``beam.smp`` when it
  runs on this machine) over the run, divided by the messages; the
  single-message rows also run against a bare grpc.aio server answering
  SendMessage with a constant (``bench/grpc_floor.py``): the per-call floor
  of the library, so the difference is halfmoon's own;
* consume throughput: receive + ack of pre-sent messages (batches of 32 +
  one AckMessage per batch / prefetch 32 + an ack per message), 4 consumers;
* through blocking clients (``bench/blocking_clients.py``): the official
  client's ``Producer.send`` → a ``SimpleConsumer`` parked in ``receive``,
  beside pika (confirms, durable queue, ``basic_consume``) against RabbitMQ:
  send latency and end-to-end latency p50/p99.

halfmoon runs twice: ``--flush async`` (acknowledged after the write, flushed
in the background) and ``--flush sync`` (acknowledged after fsync, group
commit), the like-for-like comparison with RabbitMQ's confirms, which come
after its (batched) fsync. "vs RabbitMQ" is > 1 when halfmoon is better
(more messages per second, or lower latency). Analysis: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bench.amqp_peer import AmqpPeer, amqp_url
from bench.blocking_clients import Latencies, official_latencies, pika_latencies
from bench.grpc_floor import FloorServer
from bench.halfmoon_peer import GrpcPeer, official_client_produce
from bench.load import Throughput, machine_info, percentile
from bench.server_proc import Flush, HalfmoonServer

RABBITMQ = AmqpPeer.name
PRODUCERS = (1, 16, 64)
BATCHES = (1, 32)
CONSUMERS = 4

# The targets of the endpoint's issue.
SEND_P50_MS = 1.0
SEND_P99_MS = 5.0
E2E_P99_MS = 10.0
# Latency against the peer in the same run: end-to-end p50 within 1.5x and p99 within 2x of
# RabbitMQ's, single-message send p50 no worse than RabbitMQ's.
E2E_P50_RATIO = 1.5
E2E_P99_RATIO = 2.0
SEND_P50_RATIO = 1.0
CONSUME_RATIO = 1.2  # receive + ack, 4 consumers, batch 32 vs prefetch 32


def system_name(flush: Flush) -> str:
    return f"halfmoon {flush}"


OFFICIAL = "halfmoon async, official client"
PIKA = "RabbitMQ, pika"
FLOOR = "bare grpc.aio (floor)"
SEND_CPU_US = 300.0  # server CPU per single-message send, async flush, 16 producers


@dataclass(frozen=True, slots=True)
class Settings:
    seconds: float  # per produce run and system
    latency_count: int  # timed sends per latency run
    e2e_count: int  # timed messages per end-to-end run
    consume_messages: int  # pre-sent, then received and acked
    flushes: tuple[Flush, ...] = ("async", "sync")
    official_client: bool = True


FULL = Settings(seconds=2.0, latency_count=1000, e2e_count=500, consume_messages=20_000)
QUICK = Settings(seconds=0.5, latency_count=200, e2e_count=100, consume_messages=3_000)


@dataclass(slots=True)
class Measurement:
    """One system's result in one scenario: a throughput or latency samples (seconds)."""

    system: str
    messages: int = 0
    seconds: float = 0.0
    samples: list[float] = field(default_factory=list, repr=False)
    server_cpu: float | None = None  # seconds of the server process over the run

    @property
    def cpu_us_per_message(self) -> float | None:
        if self.server_cpu is None or self.messages <= 0:
            return None
        return self.server_cpu / self.messages * 1e6

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    def p(self, q: float) -> float:
        """The q percentile in milliseconds."""
        return percentile(self.samples, q) * 1000

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"system": self.system}
        if self.samples:
            d.update(
                count=len(self.samples),
                p50_ms=self.p(0.50),
                p99_ms=self.p(0.99),
                max_ms=max(self.samples) * 1000,
            )
        else:
            d.update(messages=self.messages, seconds=self.seconds, msgs_per_s=self.per_second)
            if self.cpu_us_per_message is not None:
                d["server_cpu_us_per_msg"] = self.cpu_us_per_message
        return d


@dataclass(slots=True)
class Row:
    key: str
    scenario: str
    kind: str  # "throughput" or "latency"
    measurements: list[Measurement] = field(default_factory=list)
    peer: str = RABBITMQ  # the system the others are compared with

    def of(self, system: str) -> Measurement | None:
        return next((m for m in self.measurements if m.system == system), None)

    def vs_rabbitmq(self, m: Measurement) -> str:
        """How much better than RabbitMQ (> 1: halfmoon better); p50 and p99 for latency."""
        peer = self.of(self.peer)
        if peer is None or m.system == self.peer:
            return ""
        if self.kind == "throughput":
            return f"{m.per_second / peer.per_second:.2f}x" if peer.per_second > 0 else ""
        return f"{peer.p(0.5) / m.p(0.5):.2f}x / {peer.p(0.99) / m.p(0.99):.2f}x"


@dataclass(slots=True)
class Target:
    name: str
    measured: float
    goal: float
    unit: str
    at_most: bool  # latency goals are maxima, throughput goals minima

    @property
    def passed(self) -> bool:
        return self.measured <= self.goal if self.at_most else self.measured >= self.goal


@dataclass(slots=True)
class Report:
    rows: list[Row] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def row(self, key: str, scenario: str, kind: str, peer: str = RABBITMQ) -> Row:
        for r in self.rows:
            if r.key == key:
                return r
        r = Row(key, scenario, kind, peer=peer)
        self.rows.append(r)
        return r

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "settings": self.settings,
            "rows": [
                {
                    "key": r.key,
                    "scenario": r.scenario,
                    "kind": r.kind,
                    "peer": r.peer,
                    "measurements": [m.to_json() for m in r.measurements],
                }
                for r in self.rows
            ],
            "targets": [{**asdict(t), "passed": t.passed} for t in self.targets],
        }


# -- running the scenarios --------------------------------------------------------


def produce_key(producers: int, batch: int) -> str:
    return f"produce_p{producers}_b{batch}"


def produce_label(producers: int, batch: int) -> str:
    return f"produce, {producers} producer{'s' if producers > 1 else ''}, batch {batch}"


ScenarioLog = Callable[[str], None]


async def run_peer(peer: Any, report: Report, settings: Settings, log: ScenarioLog) -> None:
    """Every scenario on one system, rows filled in place."""

    async def throughput(key: str, label: str, run: Callable[[], Awaitable[Throughput]]) -> None:
        cpu_before = peer.server_cpu()
        result = await run()
        cpu_after = peer.server_cpu()
        m = Measurement(peer.name, result.messages, result.seconds)
        if cpu_before is not None and cpu_after is not None:
            m.server_cpu = cpu_after - cpu_before
        report.row(key, label, "throughput").measurements.append(m)
        cpu = f"{m.cpu_us_per_message:6.0f} us/msg" if m.cpu_us_per_message is not None else ""
        log(f"{peer.name:<34} {label:<40} {result.per_second:>10,.0f} msg/s {cpu}")

    async def latency(key: str, label: str, run: Callable[[], Awaitable[list[float]]]) -> None:
        m = Measurement(peer.name, samples=await run())
        report.row(key, label, "latency").measurements.append(m)
        log(f"{peer.name:<34} {label:<40} p50 {m.p(0.5):.2f} ms  p99 {m.p(0.99):.2f} ms")

    # Warm up connections and code paths before anything is timed.
    await peer.produce(4, 8, min(0.3, settings.seconds))
    for producers in PRODUCERS:
        for batch in BATCHES:
            await throughput(
                produce_key(producers, batch),
                produce_label(producers, batch),
                lambda p=producers, b=batch: peer.produce(p, b, settings.seconds),
            )
    await latency(
        "send_latency",
        "send latency, 1 producer, sequential",
        lambda: peer.send_latencies(settings.latency_count),
    )
    await latency(
        "e2e_latency",
        "end-to-end latency, long-polling consumer",
        lambda: peer.end_to_end_latencies(settings.e2e_count),
    )
    await throughput(
        "consume",
        f"consume (receive + ack), {CONSUMERS} consumers",
        lambda: peer.consume(settings.consume_messages, CONSUMERS),
    )


BLOCKING_ROWS = (
    ("blocking_send_latency", "send latency, blocking client", "send"),
    ("blocking_e2e_latency", "end-to-end latency, blocking clients", "end_to_end"),
)


def record_blocking(report: Report, system: str, result: Latencies, log: ScenarioLog) -> None:
    """The official client's (or pika's) rows: send, and send → seen by a parked receive."""
    for key, label, attribute in BLOCKING_ROWS:
        m = Measurement(system, samples=getattr(result, attribute))
        report.row(key, label, "latency", peer=PIKA).measurements.append(m)
        log(f"{system:<34} {label:<40} p50 {m.p(0.5):.2f} ms  p99 {m.p(0.99):.2f} ms")


async def run_halfmoon(flush: Flush, report: Report, settings: Settings, log: ScenarioLog) -> None:
    server = HalfmoonServer(flush=flush).start()
    try:
        peer = GrpcPeer(server, system_name(flush))
        try:
            await run_peer(peer, report, settings, log)
        finally:
            await peer.close()
        if settings.official_client and flush == "async":
            for producers in PRODUCERS:
                result = await asyncio.to_thread(
                    official_client_produce, server, producers, settings.seconds
                )
                label = produce_label(producers, 1)
                report.row(produce_key(producers, 1), label, "throughput").measurements.append(
                    Measurement(OFFICIAL, result.messages, result.seconds)
                )
                log(f"{OFFICIAL:<34} {label:<40} {result.per_second:>10,.0f} msg/s")
            latencies = await asyncio.to_thread(
                official_latencies, server, settings.latency_count, settings.e2e_count
            )
            record_blocking(report, OFFICIAL, latencies, log)
    finally:
        server.stop()


async def run_floor(report: Report, settings: Settings, log: ScenarioLog) -> None:
    """Single-message sends against a bare grpc.aio server: the per-call floor (CPU, rate)."""
    server = FloorServer().start()
    try:
        peer = GrpcPeer(server, FLOOR)  # type: ignore[arg-type]
        try:
            await peer.produce(4, 1, min(0.3, settings.seconds))
            for producers in PRODUCERS:
                label = produce_label(producers, 1)
                cpu_before = peer.server_cpu()
                result = await peer.produce(producers, 1, settings.seconds)
                cpu_after = peer.server_cpu()
                m = Measurement(FLOOR, result.messages, result.seconds)
                if cpu_before is not None and cpu_after is not None:
                    m.server_cpu = cpu_after - cpu_before
                report.row(produce_key(producers, 1), label, "throughput").measurements.append(m)
                log(
                    f"{FLOOR:<34} {label:<40} {result.per_second:>10,.0f} msg/s "
                    f"{m.cpu_us_per_message or 0:6.0f} us/msg"
                )
        finally:
            await peer.close()
    finally:
        server.stop()


async def run_all(settings: Settings, log: ScenarioLog, amqp: str | None = None) -> Report:
    report = Report(
        machine=machine_info(),
        settings={**asdict(settings), "body_bytes": 1024, "consumers": CONSUMERS},
    )
    rabbit = await AmqpPeer.open(amqp)  # fail before anything is measured when RabbitMQ is away
    try:
        report.machine["rabbitmq"] = await rabbit.server_version()
        for flush in settings.flushes:
            await run_halfmoon(flush, report, settings, log)
        await run_floor(report, settings, log)
        await run_peer(rabbit, report, settings, log)
        if settings.official_client:
            latencies = await asyncio.to_thread(
                pika_latencies, amqp or amqp_url(), settings.latency_count, settings.e2e_count
            )
            record_blocking(report, PIKA, latencies, log)
    finally:
        await rabbit.close()
    order = [system_name(f) for f in settings.flushes] + [OFFICIAL, FLOOR, RABBITMQ, PIKA]
    for row in report.rows:
        row.measurements.sort(key=lambda m: order.index(m.system))
    report.targets = targets(report, settings)
    return report


def peer_latency_targets(
    rows: dict[str, Row], send_key: str, e2e_key: str, system: str
) -> list[Target]:
    """``system``'s send p50 and end-to-end p50 / p99 against its row's peer (same run)."""
    found = []
    send, e2e = rows[send_key], rows[e2e_key]
    mine_send, peer_send = send.of(system), send.of(send.peer)
    mine_e2e, peer_e2e = e2e.of(system), e2e.of(e2e.peer)
    if mine_send is not None and peer_send is not None:
        found.append(
            Target(
                f"{system}: send p50 <= {send.peer}'s",
                mine_send.p(0.5),
                SEND_P50_RATIO * peer_send.p(0.5),
                "ms",
                at_most=True,
            )
        )
    if mine_e2e is not None and peer_e2e is not None:
        for q, ratio in ((0.5, E2E_P50_RATIO), (0.99, E2E_P99_RATIO)):
            found.append(
                Target(
                    f"{system}: end-to-end p{round(q * 100)} <= {ratio}x {e2e.peer}'s",
                    mine_e2e.p(q),
                    ratio * peer_e2e.p(q),
                    "ms",
                    at_most=True,
                )
            )
    return found


def targets(report: Report, settings: Settings) -> list[Target]:
    found: list[Target] = []
    rows = {r.key: r for r in report.rows}
    if "async" in settings.flushes:
        send = rows["send_latency"].of(system_name("async"))
        e2e = rows["e2e_latency"].of(system_name("async"))
        assert send is not None and e2e is not None
        found += [
            Target("send p50, async flush", send.p(0.5), SEND_P50_MS, "ms", at_most=True),
            Target("send p99, async flush", send.p(0.99), SEND_P99_MS, "ms", at_most=True),
            Target("end-to-end p99, async flush", e2e.p(0.99), E2E_P99_MS, "ms", at_most=True),
        ]
        found += peer_latency_targets(rows, "send_latency", "e2e_latency", system_name("async"))
    if "blocking_e2e_latency" in rows:
        found += peer_latency_targets(
            rows, "blocking_send_latency", "blocking_e2e_latency", OFFICIAL
        )
    if "async" in settings.flushes:
        sends = rows[produce_key(16, 1)]
        mine_send, floor = sends.of(system_name("async")), sends.of(FLOOR)
        if mine_send is not None and mine_send.cpu_us_per_message is not None:
            found.append(
                Target(
                    "server CPU per single-message send, async, 16 producers",
                    mine_send.cpu_us_per_message,
                    SEND_CPU_US,
                    "us",
                    at_most=True,
                )
            )
            if floor is not None and floor.cpu_us_per_message is not None:
                found.append(
                    Target(
                        "  of which above the bare grpc.aio floor (halfmoon's own)",
                        mine_send.cpu_us_per_message - floor.cpu_us_per_message,
                        SEND_CPU_US - floor.cpu_us_per_message,
                        "us",
                        at_most=True,
                    )
                )
    consume = rows["consume"]
    rabbit_consume = consume.of(RABBITMQ)
    for flush in settings.flushes:
        mine = consume.of(system_name(flush))
        if mine is not None and rabbit_consume is not None:
            found.append(
                Target(
                    f"consume, {CONSUMERS} consumers ({flush}) >= {CONSUME_RATIO}x RabbitMQ",
                    mine.per_second,
                    CONSUME_RATIO * rabbit_consume.per_second,
                    "msg/s",
                    at_most=False,
                )
            )
    # Throughput at the same durability: halfmoon sync flush (fsync before the answer)
    # against RabbitMQ's confirms (after its fsync).
    fair = system_name("sync") if "sync" in settings.flushes else system_name(settings.flushes[0])
    for row in report.rows:
        mine, peer = row.of(fair), row.of(RABBITMQ)
        if row.kind == "throughput" and mine is not None and peer is not None:
            name = f"{row.scenario} ({fair.split()[1]}) >= RabbitMQ"
            found.append(Target(name, mine.per_second, peer.per_second, "msg/s", at_most=False))
    return found


# -- output -----------------------------------------------------------------------


def format_rows(rows: list[Row]) -> str:
    header = (
        f"{'scenario':<42} {'system':<32} {'result':>30} {'vs RabbitMQ':>16} {'server CPU':>14}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        for i, m in enumerate(r.measurements):
            if r.kind == "throughput":
                result = f"{m.per_second:,.0f} msg/s {m.per_second * 1024 / 1e6:5.1f} MB/s"
            else:
                result = f"p50 {m.p(0.5):6.2f}  p99 {m.p(0.99):6.2f} ms"
            cpu = m.cpu_us_per_message
            shown = f"{cpu:,.0f} us/msg" if cpu is not None else ""
            lines.append(
                f"{r.scenario if i == 0 else '':<42} {m.system:<32} {result:>30} "
                f"{r.vs_rabbitmq(m):>16} {shown:>14}"
            )
    return "\n".join(lines)


def format_targets(found: list[Target]) -> str:
    header = f"{'target':<72} {'measured':>14} {'goal':>16}  result"
    lines = [header, "-" * len(header)]
    for t in found:
        if t.unit == "ms":
            measured, goal = f"{t.measured:.2f} ms", f"<= {t.goal:.2f} ms"
        elif t.unit == "us":
            measured, goal = f"{t.measured:,.0f} us", f"<= {t.goal:,.0f} us"
        else:
            measured, goal = f"{t.measured:,.0f}", f">= {t.goal:,.0f}"
        lines.append(f"{t.name:<72} {measured:>14} {goal:>16}  {'PASS' if t.passed else 'MISS'}")
    return "\n".join(lines)


def print_report(report: Report, out: TextIO) -> None:
    out.write("machine:\n" + "".join(f"  {k}: {v}\n" for k, v in report.machine.items()))
    out.write("settings:\n" + "".join(f"  {k}: {v}\n" for k, v in report.settings.items()) + "\n")
    out.write(format_rows(report.rows) + "\n\n")
    out.write(
        "'vs RabbitMQ' > 1 means halfmoon is better (throughput ratio; for latency p50 / p99 "
        "ratios); the blocking-client rows compare with RabbitMQ through pika.\n\n"
    )
    out.write(format_targets(report.targets) + "\n")
    out.flush()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.grpc_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a short run (about 25 s)")
    parser.add_argument("--seconds", type=float, help="seconds per produce run and system")
    parser.add_argument("--latency-count", type=int, help="timed sends per latency run")
    parser.add_argument("--e2e-count", type=int, help="timed messages per end-to-end run")
    parser.add_argument(
        "--consume-messages", type=int, help="messages pre-sent for the consume run"
    )
    parser.add_argument(
        "--flush",
        choices=["async", "sync", "both"],
        default="both",
        help="halfmoon flush modes to run",
    )
    parser.add_argument(
        "--no-official-client", action="store_true", help="skip the official Python client runs"
    )
    parser.add_argument(
        "--amqp", help=f"RabbitMQ URL (default {amqp_url()}, from HALFMOON_TEST_AMQP)"
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    base = QUICK if args.quick else FULL
    return Settings(
        seconds=args.seconds or base.seconds,
        latency_count=args.latency_count or base.latency_count,
        e2e_count=args.e2e_count or base.e2e_count,
        consume_messages=args.consume_messages or base.consume_messages,
        flushes=("async", "sync") if args.flush == "both" else (args.flush,),
        official_client=not args.no_official_client,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = asyncio.run(run_all(settings, log, args.amqp))
    print_report(report, sys.stdout)
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
