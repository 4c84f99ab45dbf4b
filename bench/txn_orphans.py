"""Scenario 3 of the transactional messages benchmark (:mod:`bench.txn_bench`):
orphan resolution by the broker's transaction checks."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

from bench.cluster_bench import cpu_seconds
from bench.load import (
    BODY_SIZE,
    body,
)
from bench.server_proc import HalfmoonServer
from bench.txn_common import (
    CHECK_WORKERS,
    ORPHAN_BATCH,
    ORPHAN_SENDERS,
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


async def plant_orphans(
    client: RawClient, topic: str, count: int, *, immunity_s: int = 0
) -> tuple[float, float, list[Any]]:
    """Send ``count`` half messages in batches; (first, last) ack times (perf_counter) and the
    send result entries. ``immunity_s`` > 0 asks the broker not to check them for that long."""
    payload = body(0, BODY_SIZE)
    remaining = count
    acked: list[float] = []
    entries: list[Any] = []

    def half() -> Any:
        message = client.message(topic, payload, transactional=True)
        if immunity_s:
            message.system_properties.orphaned_transaction_recovery_duration.seconds = immunity_s
        return message

    async def sender() -> None:
        nonlocal remaining
        while remaining > 0:
            n = min(ORPHAN_BATCH, remaining)
            remaining -= n
            sent = await client.send([half() for _ in range(n)])
            assert len(sent) == n and all(e.transaction_id for e in sent)
            entries.extend(sent)
            acked.append(time.perf_counter())

    await asyncio.gather(*(sender() for _ in range(ORPHAN_SENDERS)))
    return min(acked), max(acked), entries


def _checker(server: HalfmoonServer, topic: str, listener: CommitEverything) -> Any:
    from halfmoon.client import TransactionProducer

    return TransactionProducer(
        server.grpc,
        f"txnbench-checker-{next(names)}",
        listener,
        topics=[topic],
        check_workers=CHECK_WORKERS,
    )


async def _wait_committed(
    server: HalfmoonServer,
    topic: str,
    count: int,
    deadline: float,
    progress: Log | None = None,
    answered: Callable[[], int] | None = None,
    backlog: list[int] | None = None,
    sample: Callable[[], int] | None = None,
) -> tuple[int, float | None]:
    """Wait until the topic holds ``count`` messages (or the deadline); (count, first seen).

    A commit appends the message to its topic exactly once: the topic's message count is the
    number resolved. Asking costs the server an admin call, so with ``answered`` (the producer's
    own count of answers acknowledged) the server is asked only once the producer has answered
    ``count`` checks, then every second (a check answered twice counts twice), and every ten
    seconds for the progress line: the run being measured is not slowed by its own polling.
    ``sample`` (the producer's checks in hand) is appended to ``backlog`` at every poll.
    """
    first = None
    next_progress = time.perf_counter() + 10.0
    next_ask = 0.0
    while True:
        now = time.perf_counter()
        if sample is not None and backlog is not None:
            backlog.append(sample())
        if first is None and answered is not None and answered() > 0:
            first = now
        ask = answered is None or (answered() >= count and now >= next_ask)
        if ask or now > next_progress or now > deadline:
            committed = await asyncio.to_thread(committed_count, server, topic)
            now = time.perf_counter()
            if first is None and committed > 0:
                first = now
            if committed >= count or now > deadline:
                return committed, first
            if ask:
                next_ask = now + 1.0
            if progress is not None and now > next_progress:
                next_progress = now + 10.0
                progress(f"... {committed:,}/{count:,} resolved")
        await asyncio.sleep(STATUS_POLL_SECONDS)


async def run_answers(
    server: HalfmoonServer,
    client: RawClient,
    system: str,
    settings: Settings,
    report: Report,
    log: Log,
    key: str = "check_answers",
) -> Result:
    """The peer of orphan resolution: the same producer answering ``orphans`` checks itself.

    The half messages are planted with a check immunity of an hour, so the broker never checks
    them; then a fresh ``TransactionProducer`` with the same listener and the same number of
    check workers gives each its answer as an answered check does (the listener's
    ``check_local_transaction``, then ``EndTransaction`` COMMIT with source SERVER_CHECK), with
    ``CHECK_WORKERS`` answers in flight. Timed from the producer's start until every answer is
    acknowledged: what the producers need to answer that many checks, without the broker finding
    and sending them.
    """
    topic = fresh_topic(server, "answers", "transaction")
    _, _, entries = await plant_orphans(client, topic, settings.orphans, immunity_s=3_600)
    listener = CommitEverything()
    todo = iter(entries)

    retries = 0

    async def worker() -> None:
        nonlocal retries
        from halfmoon.client import RequestTimeout

        for entry in todo:
            resolution = await listener.check_local_transaction(None)
            for attempt in range(5):  # as the broker would check again: answered once, in the end
                try:
                    await producer.end_transaction(
                        topic, entry.message_id, entry.transaction_id, resolution, from_check=True
                    )
                    break
                except RequestTimeout:
                    retries += 1
                    if attempt == 4:
                        raise

    cpu_before, started = cpu_seconds(server.pid), time.perf_counter()
    client_before = cpu_seconds()
    producer = _checker(server, topic, listener)
    await producer.start()
    try:
        await asyncio.gather(*(worker() for _ in range(CHECK_WORKERS)))
        answered_at = time.perf_counter()
        cpu = cpu_seconds(server.pid) - cpu_before
        client_cpu = cpu_seconds() - client_before
    finally:
        await producer.close()
    committed, _ = await _wait_committed(server, topic, settings.orphans, time.perf_counter() + 30)
    when = "before" if key == "check_answers" else "after"
    result = Result(key, f"{settings.orphans:,} checks answered (peer, {when})", system)
    result.messages = committed
    result.seconds = answered_at - started
    result.extra.update(
        answers=listener.checks,
        retried_after_timeout=retries,
        server_cpu_s=cpu,
        server_cpu_us_per_answer=cpu * 1e6 / len(entries),
        client_cpu_us_per_answer=client_cpu * 1e6 / len(entries),
    )
    report.results.append(result)
    log(f"{system:<16} peer: {listener.checks:,} checks answered by the producer in "
        f"{result.seconds:.2f} s ({result.per_second:,.0f}/s), server CPU "
        f"{result.extra['server_cpu_us_per_answer']:.0f} us per answer, producer "
        f"{result.extra['client_cpu_us_per_answer']:.0f} us")  # fmt: skip
    return result


async def run_orphans(
    server: HalfmoonServer,
    client: RawClient,
    system: str,
    settings: Settings,
    report: Report,
    log: Log,
) -> None:
    """Plant the orphans with no producer live, wait until all are due, then start the checking
    producer: resolution is timed from its start, beside the peer (:func:`run_answers`), run
    once before and once after so that a change of load on a shared machine hits both sides;
    the ratio is to the mean of the two."""
    peer = await run_answers(server, client, system, settings, report, log)
    topic = fresh_topic(server, "orphans", "transaction")
    log_from = len(server.lines)
    planting = time.perf_counter()
    first_ack, last_ack, _ = await plant_orphans(client, topic, settings.orphans)
    plant_seconds = last_ack - planting
    log(f"{system:<16} planted {settings.orphans:,} orphans in {plant_seconds:.2f} s "
        f"({settings.orphans / plant_seconds:,.0f} msg/s)")  # fmt: skip
    all_due = last_ack + settings.timeout_ms / 1000
    await asyncio.sleep(max(0.0, all_due - time.perf_counter()))  # a time, not an event
    listener = CommitEverything()
    cpu_before, started = cpu_seconds(server.pid), time.perf_counter()
    client_before = cpu_seconds()
    checker = _checker(server, topic, listener)
    await checker.start()
    backlog: list[int] = []  # checks the producer holds (answering or queued), every poll
    try:
        committed, first_resolved = await _wait_committed(
            server,
            topic,
            settings.orphans,
            started + settings.resolve_timeout,
            lambda line: log(f"{system:<16} {line}, {time.perf_counter() - started:.0f} s in"),
            lambda: checker.checks_answered,
            backlog,
            lambda: checker.checks_held,
        )
        resolved_at = time.perf_counter()
        cpu = cpu_seconds(server.pid) - cpu_before
        client_cpu = cpu_seconds() - client_before
        pending = await asyncio.to_thread(pending_count, server)
        # The last scan logs its report just after its last check is answered: wait for it.
        scans = await _scans_covering(server, log_from, committed)
    finally:
        await checker.close()
    after = await run_answers(server, client, system, settings, report, log, "check_answers_after")
    peer_s = (peer.seconds + after.seconds) / 2
    peer_server_us = (
        peer.extra["server_cpu_us_per_answer"] + after.extra["server_cpu_us_per_answer"]
    ) / 2
    peer_client_us = (
        peer.extra["client_cpu_us_per_answer"] + after.extra["client_cpu_us_per_answer"]
    ) / 2
    scanned = sum(s["candidates"] for s in scans)
    scan_ms = sum(s["elapsed_ms"] for s in scans)
    result = Result("orphans", f"{settings.orphans:,} orphans resolved by checks", system)
    result.messages = committed
    result.seconds = resolved_at - started
    result.extra.update(
        orphans=settings.orphans,
        unresolved=settings.orphans - committed,
        pending_after=pending,
        plant_seconds=plant_seconds,
        first_resolved_s=(first_resolved - started) if first_resolved else None,
        all_due_to_resolved_s=resolved_at - all_due,
        resolve_s=resolved_at - started,
        peer_answer_s=peer_s,
        peer_answer_s_before_after=[peer.seconds, after.seconds],
        ratio_to_answers=(resolved_at - started) / peer_s if peer_s else None,
        server_cpu_s=cpu,
        server_cpu_us_per_orphan=cpu * 1e6 / committed if committed else None,
        peer_server_cpu_us_per_answer=peer_server_us,
        client_cpu_us_per_orphan=client_cpu * 1e6 / committed if committed else None,
        peer_client_cpu_us_per_answer=peer_client_us,
        checks_answered=listener.checks,
        checks_received=checker.checks_received,
        # How well the broker keeps the producer busy: the checks it held at each poll, and how
        # often it held fewer than its check workers (idle workers: the broker was behind).
        producer_backlog_mean=sum(backlog) / len(backlog) if backlog else None,
        producer_starved_share=sum(1 for b in backlog if b < CHECK_WORKERS) / len(backlog)
        if backlog
        else None,
        scans=len(scans),
        scan_candidates=scanned,
        checks_sent=sum(s["sent"] for s in scans),
        scan_wall_ms=scan_ms,
        scan_wall_us_per_message=(scan_ms * 1000 / scanned) if scanned else None,
        scan_reports=scans,
    )
    report.results.append(result)
    e = result.extra
    log(
        f"{system:<16} orphans resolved {committed:,}/{settings.orphans:,} in "
        f"{result.seconds:.2f} s from the checker's start ({e['ratio_to_answers']:.2f}x the "
        f"peer's {peer_s:.2f} s), server CPU {e['server_cpu_us_per_orphan'] or 0:.0f} us "
        f"per orphan (peer {e['peer_server_cpu_us_per_answer']:.0f}), producer "
        f"{e['client_cpu_us_per_orphan'] or 0:.0f} us "
        f"(peer {e['peer_client_cpu_us_per_answer']:.0f}); producer held "
        f"{e['producer_backlog_mean'] or 0:.0f} checks on average, starved "
        f"{100 * (e['producer_starved_share'] or 0):.0f}% of the time; "
        f"{len(scans)} scans, {scanned:,} candidates, {scan_ms:,} ms scan wall time"
    )
