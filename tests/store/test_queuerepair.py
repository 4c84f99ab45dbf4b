"""Opening consume queues on real files: one test per kind of damage a crash can leave."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from halfmoon.store.consumequeue import ENTRY, ENTRY_SIZE, ConsumeQueues, QueueGapError
from tests.store.queueutil import (
    expected,
    fill,
    queue_file,
    reopen,
    truncate_to,
    write_at,
    zero_entries,
)


@pytest.fixture
def cq(tmp_path: Path):
    queues = ConsumeQueues(tmp_path / "cq", entries_per_file=4)
    yield queues
    queues.close()


def test_missing_root_directory_is_an_empty_store(tmp_path: Path) -> None:
    cq = ConsumeQueues(tmp_path / "does" / "not" / "exist")
    assert cq.queues() == []
    fill(cq, "t", 0, 1)
    assert cq.entries("t", 0, 0, 1) == expected(0, 1)
    cq.close()


def test_length_not_multiple_of_entry_size_is_cut(cq: ConsumeQueues, caplog) -> None:
    fill(cq, "t", 0, 3)
    cq.close()
    path = queue_file(cq.root, "t", 0, 0)
    truncate_to(path, 2 * ENTRY_SIZE + 7)  # the third entry is torn
    with caplog.at_level(logging.WARNING, logger="halfmoon.store"):
        cq = ConsumeQueues(cq.root, 4)
    assert cq.entries("t", 0, 0, 10) == expected(0, 2)
    assert "not a multiple" in caplog.text
    fill(cq, "t", 0, 2, start=2)  # the queue continues where it was cut
    cq = reopen(cq)
    assert cq.entries("t", 0, 0, 10) == expected(0, 4)
    cq.close()


def test_truncated_queue_file_is_repaired(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 4)
    cq.close()
    truncate_to(queue_file(cq.root, "t", 0, 0), 2 * ENTRY_SIZE)
    cq = ConsumeQueues(cq.root, 4)
    assert cq.max_offset("t", 0) == 2
    assert os.path.getsize(queue_file(cq.root, "t", 0, 0)) == 4 * ENTRY_SIZE  # room again
    fill(cq, "t", 0, 3, start=2)
    assert cq.entries("t", 0, 0, 10) == expected(0, 5)
    cq.close()


def test_torn_last_entry_is_cut(cq: ConsumeQueues, caplog) -> None:
    fill(cq, "t", 0, 3)
    cq.close()
    # Only the commit-log offset of entry 2 reached the disk: its size is zero.
    write_at(queue_file(cq.root, "t", 0, 0), 2 * ENTRY_SIZE + 8, bytes(12))
    with caplog.at_level(logging.WARNING, logger="halfmoon.store"):
        cq = ConsumeQueues(cq.root, 4)
    assert cq.entries("t", 0, 0, 10) == expected(0, 2)
    assert "torn" in caplog.text
    cq.close()


def test_out_of_order_last_entry_is_cut(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 3)
    cq.close()
    write_at(queue_file(cq.root, "t", 0, 0), 2 * ENTRY_SIZE, ENTRY.pack(5, 10, 0))
    cq = ConsumeQueues(cq.root, 4)
    assert cq.max_offset("t", 0) == 2
    cq.close()


def test_zero_entry_mid_file_ends_queue_and_stale_entries_never_return(
    cq: ConsumeQueues,
) -> None:
    fill(cq, "t", 0, 4)
    cq.close()
    path = queue_file(cq.root, "t", 0, 0)
    zero_entries(path, 1, 1)  # an unflushed page between flushed ones
    cq = ConsumeQueues(cq.root, 4)
    assert cq.entries("t", 0, 0, 10) == expected(0, 1)
    cq.put("t", 0, 1, 107, 11, 1)  # re-dispatch refills entry 1 only
    cq = reopen(cq)
    assert cq.entries("t", 0, 0, 10) == expected(0, 2)  # stale 2 and 3 were cut
    cq.close()


def test_short_earlier_file_drops_later_files(cq: ConsumeQueues, caplog) -> None:
    fill(cq, "t", 0, 10)
    cq.close()
    zero_entries(queue_file(cq.root, "t", 0, 4), 2, 2)
    with caplog.at_level(logging.WARNING, logger="halfmoon.store"):
        cq = ConsumeQueues(cq.root, 4)
    assert cq.max_offset("t", 0) == 6
    assert not queue_file(cq.root, "t", 0, 8).exists()
    assert "hole" in caplog.text
    with pytest.raises(QueueGapError):
        cq.put("t", 0, 9, 907, 19, 9)  # recovery learns the queue must be rebuilt
    cq.close()


def test_garbage_names_are_ignored(cq: ConsumeQueues, caplog) -> None:
    fill(cq, "t", 0, 2)
    cq.close()
    (cq.root / "t" / "0" / "notes.txt").write_text("hi")
    (cq.root / "t" / "0" / "123").write_bytes(b"x" * 40)
    (cq.root / "t" / "zero").mkdir()
    (cq.root / "stray").write_text("x")
    with caplog.at_level(logging.WARNING, logger="halfmoon.store"):
        cq = ConsumeQueues(cq.root, 4)
    assert cq.queues() == [("t", 0)]
    assert cq.entries("t", 0, 0, 10) == expected(0, 2)
    assert "ignoring" in caplog.text
    cq.close()


def test_empty_queue_file_is_tolerated(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 2)
    cq.close()
    truncate_to(queue_file(cq.root, "t", 0, 0), 0)
    cq = ConsumeQueues(cq.root, 4)
    assert (cq.min_offset("t", 0), cq.max_offset("t", 0)) == (0, 0)
    fill(cq, "t", 0, 5)
    assert cq.entries("t", 0, 0, 10) == expected(0, 5)
    cq.close()


def test_wholly_trimmed_first_file_is_deleted_on_open(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 6)
    cq.close()
    path = queue_file(cq.root, "t", 0, 0)  # retention marked it, then the process died
    for i in range(4):
        write_at(path, i * ENTRY_SIZE, ENTRY.pack(100 * i + 7, -1, i))
    cq = ConsumeQueues(cq.root, 4)
    assert (cq.min_offset("t", 0), cq.max_offset("t", 0)) == (4, 6)
    assert not path.exists()
    cq.close()


def test_entries_survive_sigkill_without_flush(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        from halfmoon.store.consumequeue import ConsumeQueues
        cq = ConsumeQueues(Path({str(tmp_path)!r}), 4)
        for i in range(10):
            cq.put("t", 0, i, 100 * i + 7, 10 + i, i)
        print("ready", flush=True)
        sys.stdin.read()
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert child.stdout is not None
    assert child.stdout.readline() == b"ready\n"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    cq = ConsumeQueues(tmp_path, 4)
    assert cq.entries("t", 0, 0, 100) == expected(0, 10)  # the page cache outlives the process
    cq.close()
