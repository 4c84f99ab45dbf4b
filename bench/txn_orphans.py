"""Scenario 3 of the transactional messages benchmark (:mod:`bench.txn_bench`):
orphan resolution by the broker's transaction checks."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from bench.load import (
    BODY_SIZE,
    body,
)
from bench.server_proc import HalfmoonServer
from bench.txn_common import (
    CHECK_WORKERS,
    ORPHAN_BATCH,
    ORPHAN_SENDERS,
    RESOLVE_INTERVALS,
    STATUS_POLL_SECONDS,
    Log,
    RawClient,
    Report,
    Result,
    Settings,
    committed_count,
    fresh_topic,
    names,
    pending_count,
)

# The check scan's report in the server log (halfmoon/broker/transactions/check.py).
_SCAN_LINE = re.compile(
    r"event=check_scan candidates=(\d+) sent=(\d+) unsent=(\d+) parked=(\d+) "
    r"skipped=(\d+) errors=(\d+) elapsed_ms=(\d+)"
)

# -- scenario 3: orphan resolution --------------------------------------------------------------


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

    topic = fresh_topic(server, "orphans", "transaction")
    listener = CommitEverything()
    checker = TransactionProducer(
        server.grpc,
        f"txnbench-checker-{next(names)}",
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
            committed = await asyncio.to_thread(committed_count, server, topic)
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
        pending = await asyncio.to_thread(pending_count, server)
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
        f"{result.extra['all_due_to_resolved_s']:.2f} s after all were due (goal "
        f"{RESOLVE_INTERVALS * interval:.1f} s); "
        f"{len(scans)} scans, {scanned:,} candidates, {scan_ms:,} ms scan wall time"
        + (f" = {per:.0f} us/msg" if per else "")
    )
