"""The transactional messages benchmark: ``halfmoon serve`` over gRPC, three scenarios.

    python -m bench.txn_bench               # full run (100,000 orphans; about 3 minutes on 2 cores)
    python -m bench.txn_bench --quick       # a short run (2,000 orphans)
    python -m bench.txn_bench --seconds 0.3 --latency-count 20 --orphans 200 --json out.json

Every scenario runs against a real server on loopback, from this one Python
process (one clock), with 1 KiB bodies, once per flush mode: ``--flush
sync`` (an answer comes after fsync: the headline, since a transaction's
decision must be durable) and ``--flush async``.

1. **Transactional send + commit throughput** beside plain sends: 16
   concurrent producers on raw gRPC stubs; a plain round is one
   SendMessage of one NORMAL message; a transactional round is one
   SendMessage of one TRANSACTION message (the half message) then one
   EndTransaction COMMIT, counted when both are answered. Same request
   shape on both sides: one message per request, no coalescing. Plain and
   transactional turns alternate (``rounds``) so drift hits both alike.
2. **Commit-to-visible latency**: a half message is stored (untimed), then
   the clock starts as EndTransaction COMMIT is sent and stops when a
   long-polling consumer (ReceiveMessage) holds the message. One message in
   flight at a time. The EndTransaction round trip is reported beside it.
3. **Orphan resolution** (``orphan_flushes``, sync by default): ``orphans``
   half messages sent in batches of ``ORPHAN_BATCH`` entries per
   SendMessageRequest and never decided; the project client's
   ``TransactionProducer`` (same topic, a listener that answers every
   RecoverOrphanedTransactionCommand with COMMIT) is live. With
   ``transaction.timeout_ms`` = 1 s and ``check_interval_ms`` = 2 s, the
   time from when the last orphan became due (its ack + the timeout) until
   the broker reports no pending transaction is the resolution time; the
   target is two check intervals. The scan's own report (``event=check_scan``
   in the server log: candidates, sent, elapsed_ms) gives its cost per
   message; elapsed_ms is wall time, ticks apart (a tick works on a scan for
   at most ``check_tick_budget_ms``).

Targets (issue 4): transactional ≥ 0.5 × plain throughput; commit-to-visible
p99 ≤ 5 ms; every orphan resolved within two check intervals of becoming
due. Analysis: docs/benchmarks.md, "Transactional messages".
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from bench import rawstub
from bench.load import (
    BODY_SIZE,
    Arrivals,
    Throughput,
    body,
    machine_info,
    percentile,
    seq_of,
    timed_producers,
)
from bench.rawstub import check_status
from bench.server_proc import Flush, HalfmoonServer

PRODUCERS = 16
QUEUES = 8
ORPHAN_BATCH = 256  # half messages per SendMessageRequest when planting orphans
ORPHAN_SENDERS = 4  # concurrent planting requests
CHECK_WORKERS = 64  # concurrent check answers in the TransactionProducer (its default is 4)
LONG_POLL_SECONDS = 5.0
RPC_TIMEOUT = 30.0
LATENCY_WARMUP = 20
STATUS_POLL_SECONDS = 0.05

# The targets of issue 4.
TXN_RATIO_GOAL = 0.5
VISIBLE_P99_MS = 5.0
RESOLVE_INTERVALS = 2

_names = itertools.count()
_SCAN_LINE = re.compile(r"event=check_scan candidates=(\d+) sent=(\d+) unsent=(\d+) parked=(\d+) "
                        r"skipped=(\d+) errors=(\d+) elapsed_ms=(\d+)")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Settings:
    seconds: float  # per throughput turn
    rounds: int  # alternating plain / transactional turns
    latency_count: int  # timed commits in the commit-to-visible run
    orphans: int  # half messages left undecided
    timeout_ms: int = 1_000
    check_interval_ms: int = 2_000
    flushes: tuple[Flush, ...] = ("sync", "async")
    orphan_flushes: tuple[Flush, ...] = ("sync",)
    resolve_timeout: float = 120.0  # seconds after all orphans are due before giving up


# The full run waits up to 10 minutes for 100,000 orphans: at the check rate measured on
# 2 cores (about 400/s, see docs/benchmarks.md) they need about 4 of them.
FULL = Settings(seconds=3.0, rounds=2, latency_count=1000, orphans=100_000, resolve_timeout=600.0)
QUICK = Settings(seconds=1.0, rounds=1, latency_count=200, orphans=2_000)


# -- raw protocol client -------------------------------------------------------------


class RawClient:
    """The protocol stubs on one channel, the requests the official clients send."""

    def __init__(self, target: str, name: str) -> None:
        self._channel = grpc.aio.insecure_channel(target)
        self._stub = service_pb2_grpc.MessagingServiceStub(self._channel)
        self._metadata = (
            ("x-mq-client-id", f"txnbench@{os.getpid()}@{name}"),
            ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "v2"),
            ("x-mq-client-version", "5.1.2"),
        )
        self._ids = itertools.count()
        self._id_prefix = f"{os.getpid():08X}{int(time.time()) & 0xFFFFFFFF:08X}{next(_names):04X}"

    async def close(self) -> None:
        await self._channel.close()

    def message(self, topic: str, payload: bytes, *, transactional: bool) -> pb.Message:
        message = pb.Message(topic=pb.Resource(name=topic), body=payload)
        sp = message.system_properties
        sp.message_id = f"{self._id_prefix}{next(self._ids):012X}"
        sp.message_type = pb.MessageType.TRANSACTION if transactional else pb.MessageType.NORMAL
        sp.body_encoding = pb.Encoding.IDENTITY
        sp.born_host = "127.0.0.1"
        sp.born_timestamp.seconds = int(time.time())
        return message

    async def send(self, messages: list[pb.Message]) -> list[svc.SendResultEntry]:
        response = await self._stub.SendMessage(
            svc.SendMessageRequest(messages=messages), metadata=self._metadata, timeout=RPC_TIMEOUT
        )
        check_status(response.status, "SendMessage")
        return list(response.entries)

    async def commit(self, topic: str, entry: svc.SendResultEntry) -> None:
        request = svc.EndTransactionRequest(
            topic=pb.Resource(name=topic),
            message_id=entry.message_id,
            transaction_id=entry.transaction_id,
            resolution=pb.TransactionResolution.COMMIT,
            source=pb.TransactionSource.SOURCE_CLIENT,
        )
        response = await self._stub.EndTransaction(
            request, metadata=self._metadata, timeout=RPC_TIMEOUT
        )
        check_status(response.status, "EndTransaction")

    async def receive(self, group: str, topic: str) -> list[pb.Message]:
        return await rawstub.receive(
            self._stub, self._metadata, group, topic, batch=32, invisible_seconds=30,
            long_poll=LONG_POLL_SECONDS, rpc_timeout=RPC_TIMEOUT,
        )  # fmt: skip

    async def ack(self, group: str, topic: str, messages: list[pb.Message]) -> None:
        await rawstub.ack(
            self._stub, self._metadata, group, topic, messages, rpc_timeout=RPC_TIMEOUT
        )


def _fresh_topic(server: HalfmoonServer, what: str, message_type: str) -> str:
    topic = f"txnbench-{what}-{next(_names)}"
    server.create_topic(topic, queues=QUEUES, message_type=message_type)
    return topic


# -- results ---------------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    """One scenario on one server: throughput, latency samples (seconds) or orphan resolution."""

    key: str
    scenario: str
    system: str  # "halfmoon sync" / "halfmoon async"
    messages: int = 0
    seconds: float = 0.0
    samples: list[float] = field(default_factory=list, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    def p(self, q: float) -> float:
        return percentile(self.samples, q) * 1000

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"key": self.key, "scenario": self.scenario, "system": self.system}
        if self.samples:
            d.update(
                count=len(self.samples),
                p50_ms=self.p(0.5),
                p99_ms=self.p(0.99),
                max_ms=max(self.samples) * 1000,
            )
        else:
            d.update(messages=self.messages, seconds=self.seconds, msgs_per_s=self.per_second)
        return {**d, **self.extra}


@dataclass(slots=True)
class Target:
    name: str
    measured: float
    goal: float
    unit: str
    at_most: bool

    @property
    def passed(self) -> bool:
        return self.measured <= self.goal if self.at_most else self.measured >= self.goal


@dataclass(slots=True)
class Report:
    results: list[Result] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, system: str) -> Result | None:
        return next((r for r in self.results if r.key == key and r.system == system), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "settings": self.settings,
            "results": [r.to_json() for r in self.results],
            "targets": [{**asdict(t), "passed": t.passed} for t in self.targets],
        }


Log = Callable[[str], None]


# -- scenario 1: throughput ---------------------------------------------------------------


async def plain_turn(client: RawClient, topic: str, seconds: float) -> Throughput:
    payload = body(0, BODY_SIZE)

    async def one(_: int) -> int:
        return len(await client.send([client.message(topic, payload, transactional=False)]))

    return await timed_producers(PRODUCERS, seconds, one)


async def transactional_turn(client: RawClient, topic: str, seconds: float) -> Throughput:
    payload = body(0, BODY_SIZE)

    async def one(_: int) -> int:
        (entry,) = await client.send([client.message(topic, payload, transactional=True)])
        await client.commit(topic, entry)
        return 1

    return await timed_producers(PRODUCERS, seconds, one)


async def run_throughput(
    server: HalfmoonServer,
    client: RawClient,
    system: str,
    settings: Settings,
    report: Report,
    log: Log,
) -> None:
    plain_topic = _fresh_topic(server, "plain", "normal")
    txn_topic = _fresh_topic(server, "txn", "transaction")
    # Warm both paths (channel, topic caches, the first transactional append) untimed.
    await plain_turn(client, plain_topic, 0.3)
    await transactional_turn(client, txn_topic, 0.3)
    plain = Result("plain_send", f"plain send, {PRODUCERS} producers, 1 msg/request", system)
    txn = Result("txn_send_commit", f"half send + commit, {PRODUCERS} producers", system)
    for _ in range(settings.rounds):
        for result, turn, topic in (
            (plain, plain_turn, plain_topic),
            (txn, transactional_turn, txn_topic),
        ):
            done = await turn(client, topic, settings.seconds)
            result.messages += done.messages
            result.seconds += done.seconds
    pending = await asyncio.to_thread(_pending, server)
    txn.extra["pending_after"] = pending
    txn.extra["ratio_to_plain"] = txn.per_second / plain.per_second if plain.per_second else 0.0
    report.results += [plain, txn]
    log(f"{system:<16} plain {plain.per_second:>8,.0f} msg/s   txn {txn.per_second:>8,.0f} msg/s   "
        f"ratio {txn.extra['ratio_to_plain']:.2f}   pending after {pending}")  # fmt: skip


# -- scenario 2: commit-to-visible latency ---------------------------------------------------


async def run_visible_latency(
    server: HalfmoonServer,
    client: RawClient,
    system: str,
    settings: Settings,
    report: Report,
    log: Log,
) -> None:
    topic = _fresh_topic(server, "visible", "transaction")
    group = f"txnbench-visible-{next(_names)}"
    server.create_group(group, consume_from="earliest")
    consumer = RawClient(server.grpc, f"consumer-{next(_names)}")
    arrivals = Arrivals()
    acks: set[asyncio.Task[None]] = set()

    async def consume() -> None:
        while True:
            messages = await consumer.receive(group, topic)
            for message in messages:
                arrivals.arrived(seq_of(message.body))
            if messages:  # ack off the critical path
                task = asyncio.create_task(consumer.ack(group, topic, messages))
                acks.add(task)
                task.add_done_callback(acks.discard)

    polling = asyncio.create_task(consume())
    visible = Result(
        "commit_to_visible", "commit-to-visible (EndTransaction sent -> received)", system
    )
    round_trip = Result("end_transaction_rtt", "EndTransaction COMMIT round trip", system)
    try:
        for seq in range(LATENCY_WARMUP + settings.latency_count):
            (entry,) = await client.send([client.message(topic, body(seq), transactional=True)])
            received = arrivals.expect(seq)
            started = time.perf_counter()
            await client.commit(topic, entry)
            answered = time.perf_counter()
            seen = await asyncio.wait_for(received, 10.0)
            if seq >= LATENCY_WARMUP:
                visible.samples.append(seen - started)
                round_trip.samples.append(answered - started)
    finally:
        polling.cancel()
        await asyncio.gather(polling, *acks, return_exceptions=True)
        await consumer.close()
    visible.extra["visible_before_answer"] = sum(
        1 for v, r in zip(visible.samples, round_trip.samples, strict=True) if v < r
    )
    report.results += [visible, round_trip]
    log(
        f"{system:<16} commit-to-visible p50 {visible.p(0.5):.2f} ms p99 {visible.p(0.99):.2f} ms   "
        f"EndTransaction p50 {round_trip.p(0.5):.2f} ms p99 {round_trip.p(0.99):.2f} ms"
    )


# -- scenario 3: orphan resolution --------------------------------------------------------------


def _committed(server: HalfmoonServer, topic: str) -> int:
    status = server.admin_call("GET", f"/v1/topics/{topic}/status")
    assert isinstance(status, dict)
    return sum(int(q["max_offset"]) - int(q["min_offset"]) for q in status["queues"])


def _pending(server: HalfmoonServer) -> int:
    status = server.admin_call("GET", "/v1/broker/status")
    assert isinstance(status, dict)
    return int(status.get("pending_transactions") or 0)


class CommitEverything:
    """A check listener that says COMMIT to every check (the local transactions all committed)."""

    def __init__(self) -> None:
        self.checks = 0

    async def execute_local_transaction(self, message: Any, arg: Any) -> Any:
        from halfmoon.client import TransactionResolution

        return TransactionResolution.COMMIT

    async def check_local_transaction(self, message: Any) -> Any:
        from halfmoon.client import TransactionResolution

        self.checks += 1
        return TransactionResolution.COMMIT


def _scan_reports(lines: list[str]) -> list[dict[str, int]]:
    names = ("candidates", "sent", "unsent", "parked", "skipped", "errors", "elapsed_ms")
    found = []
    for line in lines:
        match = _SCAN_LINE.search(line)
        if match:
            found.append(dict(zip(names, map(int, match.groups()), strict=True)))
    return found


async def _scans_covering(
    server: HalfmoonServer, log_from: int, checks: int
) -> list[dict[str, int]]:
    """The scan reports logged since ``log_from``, once they account for ``checks`` resolved
    orphans (or after a few seconds: a report never logged must not hang the run).

    A check answered before the scan counted it is reported as ``skipped`` (decided
    while the check was on its way), so sent + skipped is what the scans handled.
    """
    deadline = time.perf_counter() + 5.0
    while True:
        scans = [s for s in _scan_reports(server.lines[log_from:]) if s["candidates"]]
        if sum(s["sent"] + s["skipped"] for s in scans) >= checks or time.perf_counter() > deadline:
            return scans
        await asyncio.sleep(STATUS_POLL_SECONDS)


async def plant_orphans(client: RawClient, topic: str, count: int) -> tuple[float, float]:
    """Send ``count`` half messages in batches; (first, last) ack times (perf_counter)."""
    payload = body(0, BODY_SIZE)
    remaining = count
    acked: list[float] = []

    async def sender() -> None:
        nonlocal remaining
        while remaining > 0:
            n = min(ORPHAN_BATCH, remaining)
            remaining -= n
            entries = await client.send(
                [client.message(topic, payload, transactional=True) for _ in range(n)]
            )
            assert len(entries) == n and all(e.transaction_id for e in entries)
            acked.append(time.perf_counter())

    await asyncio.gather(*(sender() for _ in range(ORPHAN_SENDERS)))
    return min(acked), max(acked)


async def run_orphans(
    server: HalfmoonServer,
    client: RawClient,
    system: str,
    settings: Settings,
    report: Report,
    log: Log,
) -> None:
    from halfmoon.client import TransactionProducer

    topic = _fresh_topic(server, "orphans", "transaction")
    listener = CommitEverything()
    checker = TransactionProducer(
        server.grpc,
        f"txnbench-checker-{next(_names)}",
        listener,
        topics=[topic],
        check_workers=CHECK_WORKERS,
    )
    await checker.start()
    try:
        log_from = len(server.lines)
        planting = time.perf_counter()
        first_ack, last_ack = await plant_orphans(client, topic, settings.orphans)
        plant_seconds = last_ack - planting
        log(f"{system:<16} planted {settings.orphans:,} orphans in {plant_seconds:.2f} s "
            f"({settings.orphans / plant_seconds:,.0f} msg/s)")  # fmt: skip
        all_due = last_ack + settings.timeout_ms / 1000
        interval = settings.check_interval_ms / 1000
        deadline = all_due + settings.resolve_timeout
        first_resolved = None
        next_progress = time.perf_counter() + 10.0
        # A commit appends the message to its topic exactly once: the topic's message
        # count is the number resolved (cheap to ask, unlike the pending-set statistics).
        while True:
            committed = await asyncio.to_thread(_committed, server, topic)
            now = time.perf_counter()
            if first_resolved is None and committed > 0:
                first_resolved = now
            if committed >= settings.orphans or now > deadline:
                break
            if now > next_progress:
                next_progress = now + 10.0
                log(f"{system:<16} ... {committed:,}/{settings.orphans:,} resolved, "
                    f"{now - all_due:.0f} s after all were due")  # fmt: skip
            await asyncio.sleep(STATUS_POLL_SECONDS)
        resolved_at = time.perf_counter()
        pending = await asyncio.to_thread(_pending, server)
        # The last scan logs its report just after its last check is answered: wait for it.
        scans = await _scans_covering(server, log_from, committed)
    finally:
        await checker.close()
    scanned = sum(s["candidates"] for s in scans)
    scan_ms = sum(s["elapsed_ms"] for s in scans)
    result = Result("orphans", f"{settings.orphans:,} orphans resolved by checks", system)
    result.messages = committed
    result.seconds = resolved_at - all_due  # time after all became due
    result.extra.update(
        orphans=settings.orphans,
        unresolved=settings.orphans - committed,
        pending_after=pending,
        plant_seconds=plant_seconds,
        first_due_to_first_resolved_s=(first_resolved - (first_ack + settings.timeout_ms / 1000))
        if first_resolved
        else None,
        all_due_to_resolved_s=resolved_at - all_due,
        goal_s=RESOLVE_INTERVALS * interval,
        checks_answered=listener.checks,
        scans=len(scans),
        scan_candidates=scanned,
        checks_sent=sum(s["sent"] for s in scans),
        scan_wall_ms=scan_ms,
        scan_wall_us_per_message=(scan_ms * 1000 / scanned) if scanned else None,
        scan_reports=scans,
    )
    report.results.append(result)
    per = result.extra["scan_wall_us_per_message"]
    log(
        f"{system:<16} orphans resolved {result.messages:,}/{settings.orphans:,} "
        f"{result.extra['all_due_to_resolved_s']:.2f} s after all were due (goal {RESOLVE_INTERVALS * interval:.1f} s); "
        f"{len(scans)} scans, {scanned:,} candidates, {scan_ms:,} ms scan wall time"
        + (f" = {per:.0f} us/msg" if per else "")
    )


# -- the run ---------------------------------------------------------------------------------------


def system_name(flush: Flush) -> str:
    return f"halfmoon {flush}"


async def run_server(flush: Flush, settings: Settings, report: Report, log: Log) -> None:
    server_settings = (
        f"transaction.timeout_ms={settings.timeout_ms}ms",
        f"transaction.check_interval_ms={settings.check_interval_ms}ms",
    )
    system = system_name(flush)
    server = HalfmoonServer(flush=flush, settings=server_settings).start()
    try:
        client = RawClient(server.grpc, f"producer-{flush}")
        try:
            await run_throughput(server, client, system, settings, report, log)
            await run_visible_latency(server, client, system, settings, report, log)
            if flush in settings.orphan_flushes and settings.orphans > 0:
                await run_orphans(server, client, system, settings, report, log)
        finally:
            await client.close()
    finally:
        server.stop()


async def run_all(settings: Settings, log: Log) -> Report:
    report = Report(
        machine=machine_info(),
        settings={
            **asdict(settings),
            "body_bytes": BODY_SIZE,
            "producers": PRODUCERS,
            "orphan_batch": ORPHAN_BATCH,
            "check_workers": CHECK_WORKERS,
        },
    )
    for flush in settings.flushes:
        await run_server(flush, settings, report, log)
    report.targets = targets(report, settings)
    return report


def targets(report: Report, settings: Settings) -> list[Target]:
    found = []
    for flush in settings.flushes:
        system = system_name(flush)
        txn = report.get("txn_send_commit", system)
        if txn is not None:
            found.append(
                Target(
                    f"txn / plain throughput, {flush}",
                    txn.extra["ratio_to_plain"],
                    TXN_RATIO_GOAL,
                    "x",
                    at_most=False,
                )
            )
        visible = report.get("commit_to_visible", system)
        if visible is not None:
            found.append(
                Target(
                    f"commit-to-visible p99, {flush}",
                    visible.p(0.99),
                    VISIBLE_P99_MS,
                    "ms",
                    at_most=True,
                )
            )
        orphans = report.get("orphans", system)
        if orphans is not None:
            measured = (
                orphans.extra["all_due_to_resolved_s"]
                if not orphans.extra["unresolved"]
                else float("inf")
            )
            found.append(Target(f"{orphans.extra['orphans']:,} orphans resolved after due, {flush}",
                                measured, orphans.extra["goal_s"], "s", at_most=True))  # fmt: skip
    return found


# -- output
# ------------------------------------------------------------------------------------------


def format_result(r: Result) -> str:
    if r.samples:
        return (
            f"p50 {r.p(0.5):7.2f} ms  p99 {r.p(0.99):7.2f} ms  max {max(r.samples) * 1000:7.2f} ms"
        )
    if r.key == "orphans":
        e = r.extra
        per = e["scan_wall_us_per_message"]
        return (
            f"{r.messages:,}/{e['orphans']:,} resolved {e['all_due_to_resolved_s']:.2f} s after all due; "
            f"{e['scans']} scans, scan wall {e['scan_wall_ms']:,} ms"
            + (f" ({per:.0f} us/msg)" if per else "")
        )
    text = f"{r.per_second:>9,.0f} msg/s"
    if "ratio_to_plain" in r.extra:
        text += f"  ({r.extra['ratio_to_plain']:.2f}x plain)"
    return text


def print_report(report: Report, out: TextIO) -> None:
    out.write("machine:\n" + "".join(f"  {k}: {v}\n" for k, v in report.machine.items()))
    out.write("settings:\n" + "".join(f"  {k}: {v}\n" for k, v in report.settings.items()) + "\n")
    header = f"{'scenario':<52} {'system':<15} result"
    out.write(header + "\n" + "-" * 120 + "\n")
    for r in report.results:
        out.write(f"{r.scenario:<52} {r.system:<15} {format_result(r)}\n")
    out.write("\n")
    header = f"{'target':<48} {'measured':>12} {'goal':>12}  result"
    out.write(header + "\n" + "-" * len(header) + "\n")
    for t in report.targets:
        sign = "<=" if t.at_most else ">="
        out.write(f"{t.name:<48} {t.measured:>9.2f} {t.unit:<2} {sign} {t.goal:>6.2f} {t.unit:<2}  "
                  f"{'PASS' if t.passed else 'MISS'}\n")  # fmt: skip
    out.flush()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.txn_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a short run (2,000 orphans)")
    parser.add_argument("--seconds", type=float, help="seconds per throughput turn")
    parser.add_argument("--rounds", type=int, help="alternating plain / transactional turns")
    parser.add_argument(
        "--latency-count", type=int, help="timed commits in the commit-to-visible run"
    )
    parser.add_argument("--orphans", type=int, help="half messages left undecided (0: skip)")
    parser.add_argument("--flush", choices=["async", "sync", "both"], default="both")
    parser.add_argument("--orphan-flush", choices=["async", "sync", "both"], default="sync",
                        help="flush modes that run the orphan scenario (default sync)")  # fmt: skip
    parser.add_argument(
        "--resolve-timeout", type=float, help="seconds after the orphans are due before giving up"
    )
    parser.add_argument("--json", help="also write the results as JSON here")
    return parser.parse_args(argv)


def _flushes(choice: str) -> tuple[Flush, ...]:
    return ("sync", "async") if choice == "both" else (choice,)  # type: ignore[return-value]


def settings_from(args: argparse.Namespace) -> Settings:
    base = QUICK if args.quick else FULL
    return Settings(
        seconds=args.seconds or base.seconds,
        rounds=args.rounds or base.rounds,
        latency_count=args.latency_count or base.latency_count,
        orphans=base.orphans if args.orphans is None else args.orphans,
        flushes=_flushes(args.flush),
        orphan_flushes=_flushes(args.orphan_flush),
        resolve_timeout=args.resolve_timeout or base.resolve_timeout,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = asyncio.run(run_all(settings_from(args), log))
    print_report(report, sys.stdout)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
