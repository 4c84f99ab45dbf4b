"""Relay processes SIGKILLed mid-batch: nothing lost, and only in-flight messages published
twice."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

from sqlalchemy import select

from halfmoon.outbox import Outbox
from tests.outbox.conftest import wait_until
from tests.outbox.relay_process import read_lines
from tests.outbox.test_relay_concurrency import fill, start_relays

WORKERS, BATCH = 2, 10


def test_sigkilled_relays_lose_nothing(outbox: Outbox, tmp_path: Path) -> None:
    expected = fill(outbox)
    out = tmp_path / "published.log"
    # Slow publishes (3 ms each) so the kill lands inside batches; a 2 s lease on SQLite.
    procs = start_relays(
        outbox,
        out,
        3,
        "--workers",
        str(WORKERS),
        "--batch",
        str(BATCH),
        "--delay",
        "0.003",
        "--lease",
        "2",
    )
    try:
        wait_until(
            lambda: len(read_lines(str(out))) >= 150, 30, "the relays to publish a first part"
        )
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
        for proc in procs:
            proc.wait(10)
    killed = {proc.pid for proc in procs}
    with outbox.engine.connect() as conn:
        sent_at_kill = set(
            conn.execute(
                select(outbox.table.c.message_id).where(outbox.table.c.status == "sent")
            ).scalars()
        )
    before = len(read_lines(str(out)))
    assert 0 < len(sent_at_kill) < len(expected)
    in_flight_max = len(procs) * WORKERS * BATCH

    survivor = start_relays(outbox, out, 1, "--workers", "2", "--batch", "50")
    try:
        wait_until(lambda: outbox.status().pending == 0, 40, "a new relay to finish the outbox")
    finally:
        survivor[0].terminate()
        survivor[0].wait(15)

    lines = read_lines(str(out))
    counts = Counter(line[0] for line in lines)
    assert set(counts) == set(expected), "a message was lost"
    duplicated = {mid for mid, n in counts.items() if n > 1}
    # Duplicates only for messages published by a killed relay whose batch never committed.
    assert not duplicated & sent_at_kill
    assert all(n == 2 for n in counts.values() if n > 1)
    assert len(duplicated) <= in_flight_max
    assert all(pid in killed for mid, _a, _s, pid in lines[:before] if mid in duplicated)
    # Per aggregate, first publications stay in sequence order.
    first: dict[str, list[int]] = {}
    seen: set[str] = set()
    for mid, aggregate, seq, _pid in lines:
        if mid not in seen:
            seen.add(mid)
            first.setdefault(aggregate, []).append(seq)
    assert all(seqs == sorted(seqs) for seqs in first.values())
