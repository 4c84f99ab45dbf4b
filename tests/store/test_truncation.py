"""Cutting a diverged log back (``MessageStore.truncate``): the log, the consume queues and the
key index forget the tail, the store follows its new master from the cut, and a crash at any
point of the cut leaves a store that opens cut."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from halfmoon import failpoints
from halfmoon.store import MessageStore
from halfmoon.store.truncation import INTENT_FILE, TruncationRefused
from tests.store.storeutil import SEGMENT, message, open_store
from tests.store.test_shipping import log_bytes, ship_all


def bodies(store: MessageStore, queue_id: int) -> list[bytes]:
    got = store.get("orders", queue_id, 0, max_messages=1000)
    return [m.body for m in got.messages]


def diverge(old_dir: Path, new_dir: Path, flush: str) -> int:
    """An old master and a replica sharing a prefix, then each writing its own tail (the old
    master's past a segment roll, with keys); returns where they part."""
    with open_store(old_dir, flush=flush) as old, open_store(new_dir, flush=flush) as new:
        old.put([message(i, queue_id=i % 2, size=900) for i in range(40)])
        ship_all(old, new)
        parted = old.end_offset
        old.put([message(i, queue_id=i % 2, size=900) for i in range(1000, 1090)])
        assert old.end_offset > (parted // SEGMENT + 1) * SEGMENT  # the tail rolled a segment
        new.put([message(i, queue_id=i % 2, size=300) for i in range(2000, 2030)])
    return parted


def check_cut(store: MessageStore, parted: int) -> None:
    assert store.end_offset == store.visible_offset == parted
    assert store.max_offset("orders", 0) == store.max_offset("orders", 1) == 20
    assert len(bodies(store, 0)) == 20
    assert store.query_by_key("orders", "key-1001") == []  # the tail's keys are gone
    assert [m.queue_offset for m in store.query_by_key("orders", "key-7")] == [3]


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_a_cut_store_forgets_its_tail_and_follows_the_new_master(
    tmp_path: Path, flush: str
) -> None:
    parted = diverge(tmp_path / "old", tmp_path / "new", flush)
    with open_store(tmp_path / "old", flush=flush) as old:
        assert old.max_offset("orders", 0) == 65
        assert old.truncate(parted) == parted
        check_cut(old, parted)
        assert not (tmp_path / "old" / INTENT_FILE).exists()
        with open_store(tmp_path / "new", flush=flush) as new:
            ship_all(new, old)
            assert old.wait_durable(old.end_offset, 5)  # under sync, visible once flushed
            for queue_id in (0, 1):
                assert bodies(old, queue_id) == bodies(new, queue_id)
                assert old.max_offset("orders", queue_id) == 35
            assert [m.body for m in old.query_by_key("orders", "key-2001")] == [
                m.body for m in new.query_by_key("orders", "key-2001")
            ]
            assert old.wait_durable(old.end_offset, 5)
    assert log_bytes(tmp_path / "old") == log_bytes(tmp_path / "new")
    with open_store(tmp_path / "old", flush=flush) as reopened:  # recovery agrees
        assert reopened.max_offset("orders", 1) == 35
        assert reopened.query_by_key("orders", "key-1001") == []


def test_a_cut_store_reopens_cut(tmp_path: Path) -> None:
    parted = diverge(tmp_path / "old", tmp_path / "new", "async")
    with open_store(tmp_path / "old") as old:
        old.truncate(parted)
    with open_store(tmp_path / "old") as old:
        check_cut(old, parted)
        old.put([message(3000)])  # and writes on from the cut
        assert old.get("orders", 0, 20).messages[0].body == message(3000).body


def test_cutting_at_or_past_the_end_changes_nothing(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        store.put([message(i) for i in range(5)])
        end = store.end_offset
        assert store.truncate(end + 100) == end
        assert store.max_offset("orders", 0) == 5
        assert not (tmp_path / INTENT_FILE).exists()


def test_cutting_below_the_retained_log_is_refused(tmp_path: Path) -> None:
    with open_store(tmp_path) as store:
        store.put([message(i, size=900) for i in range(200)])  # a few segments
        store.put([message(i, size=10) for i in range(3)])
        store._commitlog.delete_oldest()  # as retention does
        with pytest.raises(TruncationRefused, match="below its retained start"):
            store.truncate(10)
        assert store.max_offset("orders", 0) == 203


def test_an_unfinished_cut_is_finished_when_the_store_opens(tmp_path: Path) -> None:
    """The intent written and nothing else done (the checkpoint still past the cut): opening
    cuts the log, queues and index as recovery after a crash."""
    parted = diverge(tmp_path / "old", tmp_path / "new", "async")
    (tmp_path / "old" / INTENT_FILE).write_text(f"{parted}\n")
    with open_store(tmp_path / "old") as old:
        check_cut(old, parted)
        assert old.recovery.crashed
    assert not (tmp_path / "old" / INTENT_FILE).exists()


@pytest.mark.parametrize("point", ["truncate-after-log", "truncate-before-clear"])
def test_a_cut_killed_midway_opens_cut(tmp_path: Path, point: str) -> None:
    parted = diverge(tmp_path / "old", tmp_path / "new", "sync")
    reached = tmp_path / "reached"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.store.truncate_child", str(tmp_path / "old"), str(parted)],
        env={**os.environ, failpoints.STORE_ENV: f"{point}={reached}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while not reached.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # polling for the child to reach its failpoint, with a deadline
        assert reached.exists(), child.communicate(timeout=5)[0][-3000:]
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    assert (tmp_path / "old" / INTENT_FILE).exists()  # killed before the cut was finished
    with open_store(tmp_path / "old", flush="sync") as old:
        check_cut(old, parted)
        with open_store(tmp_path / "new", flush="sync") as new:
            ship_all(new, old)
            assert old.wait_durable(old.end_offset, 5)
            assert bodies(old, 1) == bodies(new, 1)
    assert log_bytes(tmp_path / "old") == log_bytes(tmp_path / "new")
