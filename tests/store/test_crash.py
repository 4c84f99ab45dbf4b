"""A real crash test: SIGKILL a child appending with sync flush, many times over.

After each kill the store is reopened (recovering) and checked: every
acknowledged record is present and intact, and every record that is there
decodes with a good CRC (nothing unacknowledged is half there).
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from halfmoon.store import MessageStore, StoreConfig
from tests.store.crash_child import body_for

ROUNDS = 25
BUDGET_SECONDS = 30.0
ROOT = Path(__file__).resolve().parents[2]


def _run_and_kill(data_dir: Path, round_number: int, rng: random.Random) -> list[tuple[int, str]]:
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.store.crash_child", str(data_dir), str(round_number), "6"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acked: list[tuple[int, str]] = []
    try:
        assert child.stdout is not None
        first = child.stdout.readline()
        assert first == "ready\n", first + child.stderr.read() if child.stderr else first
        target = rng.randint(1, 400)
        for line in child.stdout:
            _, offset, message_id = line.split()
            acked.append((int(offset), message_id))
            if len(acked) >= target:
                break
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    # Lines written before the kill may still sit in the pipe: they were acked too.
    assert child.stdout is not None
    for line in child.stdout.read().splitlines():
        parts = line.split()
        if len(parts) == 3:
            acked.append((int(parts[1]), parts[2]))
    return acked


def _check(data_dir: Path, acked: dict[str, int]) -> int:
    store = MessageStore(StoreConfig(data_dir=data_dir, segment_size=256 * 1024, flush="async"))
    try:
        assert store.recovery.crashed
        for message_id, offset in acked.items():
            message = store.read_at(offset)  # verifies the CRC
            assert message.unique_id == message_id
            assert message.body == body_for(message_id)
        seen = 0
        for topic, queue_id in store.queues():
            offset = expected = store.min_offset(topic, queue_id)
            while True:
                got = store.get(topic, queue_id, offset, 256)
                for message in got.messages:
                    whole = store.read_at(message.commit_log_offset)
                    assert whole.body == body_for(whole.unique_id)
                    assert message.queue_offset == expected  # dense, in order
                    expected += 1
                seen += len(got.messages)
                if got.next_offset == offset:
                    break
                offset = got.next_offset
            assert offset == store.max_offset(topic, queue_id)
        return seen
    finally:
        store.close()


@pytest.mark.slow
def test_acknowledged_sync_appends_survive_sigkill(tmp_path):
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    data_dir = tmp_path / "store"
    acked: dict[str, int] = {}
    started = time.monotonic()
    rounds = 0
    while rounds < ROUNDS and time.monotonic() - started < BUDGET_SECONDS:
        for offset, message_id in _run_and_kill(data_dir, rounds, rng):
            acked[message_id] = offset
        stored = _check(data_dir, acked)
        assert stored >= len(acked)
        rounds += 1
    assert rounds >= 10, f"only {rounds} rounds fit in the time budget"
    print(f"{rounds} kill rounds, {len(acked)} acknowledged records verified")
    assert len(acked) > 100
