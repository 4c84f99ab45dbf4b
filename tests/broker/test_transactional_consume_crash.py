"""A crash at each step of a commit that holds acks: all of it or none of it after recovery.

A child process (``consume_crash_child``) on a real store receives inputs,
registers an output and an ack for each in one transaction group, commits,
and SIGKILLs itself at a chosen step. Reopening the broker (recovery runs)
must show: before the commit record, no output and every input back; from the
commit record on, every output exactly once and no input ever delivered again.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from halfmoon.broker.filter_spec import FilterSpec
from tests.broker.consume_crash_child import GROUP, INPUTS, STEPS, open_broker

ROOT = Path(__file__).resolve().parents[2]


def run_child(tmp_path: Path, step: str, snapshot_after_receive: bool) -> None:
    child = subprocess.run(
        [sys.executable, "-m", "tests.broker.consume_crash_child", str(tmp_path / "data"),
         str(tmp_path / "meta"), step, "1" if snapshot_after_receive else "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert child.returncode == -9, child.stderr


@pytest.mark.parametrize("snapshot_after_receive", [False, True])
@pytest.mark.parametrize("step", STEPS)
def test_crash_at_each_step_of_a_commit_with_acks(
    tmp_path: Path, step: str, snapshot_after_receive: bool
) -> None:
    run_child(tmp_path, step, snapshot_after_receive)
    store, broker = open_broker(tmp_path / "data", tmp_path / "meta")
    try:
        outputs = Counter(
            m.body
            for queue_id in range(2)
            for m in broker.pull("audit", "out", queue_id, 0, 100, FilterSpec()).messages
        )
        inputs = broker.receive(GROUP, "in", FilterSpec(), 100, 60_000)
        if step == "registered":
            assert outputs == Counter()
            assert sorted(m.body for m in inputs) == [f"i{n}".encode() for n in range(INPUTS)]
        else:
            assert outputs == Counter(f"oi{n}".encode() for n in range(INPUTS))
            assert inputs == []
            progress = broker.group_progress(GROUP, "in")
            assert sum(p.committed_offset for p in progress) == INPUTS
            assert all(p.inflight == 0 for p in progress)
    finally:
        broker.close()
        store.close()
    # A second restart keeps the outcome (replay is idempotent, the state files agree).
    store, broker = open_broker(tmp_path / "data", tmp_path / "meta")
    try:
        again = broker.receive(GROUP, "in", FilterSpec(), 100, 60_000)
        if step == "registered":  # never acked: received again, the attempt counted
            assert (
                sorted(m.delivery_attempt for m in again) == [2 + snapshot_after_receive] * INPUTS
            )
        else:
            assert again == []
    finally:
        broker.close()
        store.close()
