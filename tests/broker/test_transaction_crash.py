"""A real crash test: SIGKILL a child committing transactions and transaction groups, many times.

After each kill the parent reopens the broker (recovery runs) and checks:
every acknowledged commit is visible exactly once, every message of an
acknowledged group commit is visible, nothing meant to be rolled back or left
pending is visible, and every group is visible entirely or not at all.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from halfmoon.broker.filter_spec import FilterSpec
from tests.broker.txn_crash_child import QUEUES, TOPIC, open_broker

ROUNDS = 15
BUDGET_SECONDS = 45.0
ROOT = Path(__file__).resolve().parents[2]


def _run_and_kill(data: Path, meta: Path, round_number: int, rng: random.Random) -> list[str]:
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.broker.txn_crash_child",
            str(data),
            str(meta),
            str(round_number),
            str(rng.randrange(10**6)),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    enough = threading.Event()
    # Kill after a random number of lines, or (every other round) right after the child
    # announced its n-th group: it is then committing that group.
    target = rng.randint(5, 60)
    group_target = rng.randint(1, 4) if rng.random() < 0.5 else None

    def read() -> None:
        assert child.stdout is not None
        groups = 0
        for line in child.stdout:
            lines.append(line.strip())
            groups += line.startswith("GI ")
            if (len(lines) >= target and group_target is None) or (
                group_target is not None and groups >= group_target
            ):
                enough.set()
        enough.set()  # EOF: the child died on its own (reported below)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert enough.wait(30), "the child produced too little output"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        reader.join(10)
    assert lines and lines[0] == "ready", (lines[:3], child.stderr.read() if child.stderr else "")
    assert child.returncode == -signal.SIGKILL, child.stderr.read() if child.stderr else ""
    return lines[1:]


def _visible(data: Path, meta: Path) -> list[tuple[str, bytes, str | None]]:
    store, broker = open_broker(data, meta)  # recovery runs here
    try:
        found = []
        for queue_id in range(QUEUES):
            offset = 0
            while True:
                got = broker.pull("check", TOPIC, queue_id, offset, 1000, FilterSpec())
                found += [(m.message_id, m.body, m.transaction_group) for m in got.messages]
                if got.next_offset == offset or not got.messages:
                    break
                offset = got.next_offset
        return found
    finally:
        broker.close()
        store.close()


def test_acknowledged_commits_survive_sigkill_exactly_once(tmp_path: Path) -> None:
    data, meta = tmp_path / "data", tmp_path / "meta"
    rng = random.Random(int(os.environ.get("HALFMOON_CRASH_SEED", "4")))
    acked_commits: set[str] = set()
    group_members: dict[str, list[str]] = {}
    acked_groups: set[str] = set()
    deadline = time.monotonic() + BUDGET_SECONDS
    rounds = 0
    while rounds < ROUNDS and time.monotonic() < deadline:
        for line in _run_and_kill(data, meta, rounds, rng):
            kind, _, rest = line.partition(" ")
            if kind == "C":
                acked_commits.add(rest)
            elif kind == "GI":
                group, ids = rest.split(" ")
                group_members[group] = ids.split(",")
            elif kind == "GC":
                acked_groups.add(rest)
        rounds += 1
        seen = _visible(data, meta)
        counts = Counter(message_id for message_id, _, _ in seen)
        doubled = [m for m, n in counts.items() if n > 1]
        assert not doubled, f"round {rounds}: visible more than once: {doubled[:5]}"
        for message_id, body, group in seen:
            intent = body.split(b":", 1)[0]
            assert intent in (b"c", b"gc"), f"round {rounds}: {message_id} ({intent!r}) is visible"
            if group is not None:
                assert group in group_members, (
                    f"round {rounds}: group {group} visible before it was ended"
                )
        missing = acked_commits - counts.keys()
        assert not missing, f"round {rounds}: acknowledged commits lost: {sorted(missing)[:5]}"
        by_group = Counter(group for _, _, group in seen if group is not None)
        for group, members in group_members.items():
            assert by_group.get(group, 0) in (0, len(members)), (
                f"round {rounds}: group {group} partly visible "
                f"({by_group.get(group)} of {len(members)})"
            )
            if group in acked_groups:
                assert by_group.get(group) == len(members), (
                    f"round {rounds}: acknowledged group {group} lost"
                )
    assert rounds >= 5, f"only {rounds} rounds within the budget"
    assert acked_commits and acked_groups, "the child never got far enough to commit"
