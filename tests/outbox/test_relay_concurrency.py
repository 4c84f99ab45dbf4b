"""Four relay processes at once: every message published exactly once, each aggregate in order."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from halfmoon.outbox import Outbox, OutboxMessage
from tests.outbox.conftest import wait_until
from tests.outbox.relay_process import read_lines
from tests.server.conftest import ROOT

AGGREGATES = 40
PER_AGGREGATE = 20


def start_relays(outbox: Outbox, out: Path, count: int, *extra: str) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.outbox.relay_process",
                str(outbox.engine.url.render_as_string(hide_password=False)),
                outbox.tables.prefix,
                str(out),
                *extra,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for _ in range(count)
    ]
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "relay ready" in line, line + proc.stdout.read()
    return procs


def fill(outbox: Outbox) -> dict[str, tuple[str, int]]:
    """Interleave the aggregates' messages; the sequence number is the payload."""
    expected: dict[str, tuple[str, int]] = {}
    for seq in range(PER_AGGREGATE):
        with outbox.engine.begin() as conn:
            messages = [
                OutboxMessage("t", str(seq).encode(), aggregate_type="acct", aggregate_id=f"a{a}")
                for a in range(AGGREGATES)
            ]
            for mid, m in zip(outbox.add_many(conn, messages), messages, strict=True):
                expected[mid] = (m.aggregate_id, seq)
    return expected


def test_four_relays_publish_each_message_once_in_aggregate_order(
    outbox: Outbox, tmp_path: Path
) -> None:
    out = tmp_path / "published.log"
    procs = start_relays(outbox, out, 4, "--workers", "2", "--batch", "16")
    try:
        expected = fill(outbox)
        wait_until(lambda: outbox.status().pending == 0, 40, "four relays to drain the outbox")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(15)
    lines = read_lines(str(out))
    ids = [line[0] for line in lines]
    assert len(ids) == len(set(ids)), "a message was published twice without any crash"
    assert set(ids) == set(expected)
    assert len({line[3] for line in lines}) > 1, "only one relay did any work"
    last: dict[str, int] = defaultdict(lambda: -1)
    for _mid, aggregate, seq, _pid in lines:
        assert seq == last[aggregate] + 1, (
            f"aggregate {aggregate}: published {seq} after {last[aggregate]}"
        )
        last[aggregate] = seq
