"""Consume queues on real files: round trips, retention, recovery, one test per damage."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from halfmoon.errors import InvalidArgument
from halfmoon.store.consumequeue import (
    ENTRY,
    ENTRY_SIZE,
    ConsumeQueues,
    QueueEntry,
    QueueGapError,
)

# -- damage helpers ---------------------------------------------------------


def queue_file(root: Path, topic: str, queue_id: int, start: int) -> Path:
    return root / topic / str(queue_id) / f"{start:020d}"


def truncate_to(path: Path, size: int) -> None:
    os.truncate(path, size)


def write_at(path: Path, position: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(position)
        fh.write(data)


def zero_entries(path: Path, first: int, count: int) -> None:
    write_at(path, first * ENTRY_SIZE, bytes(count * ENTRY_SIZE))


def fill(cq: ConsumeQueues, topic: str, queue_id: int, count: int, start: int = 0) -> None:
    """Entry i points at commit-log offset 100*i + 7 with size 10 + i and tag i."""
    for i in range(start, start + count):
        cq.put(topic, queue_id, i, 100 * i + 7, 10 + i, i)


def expected(first: int, stop: int) -> list[QueueEntry]:
    return [QueueEntry(i, 100 * i + 7, 10 + i, i) for i in range(first, stop)]


def reopen(cq: ConsumeQueues, entries_per_file: int = 4) -> ConsumeQueues:
    cq.close()
    return ConsumeQueues(cq.root, entries_per_file)


@pytest.fixture
def cq(tmp_path: Path):
    queues = ConsumeQueues(tmp_path / "cq", entries_per_file=4)
    yield queues
    queues.close()


# -- round trips ------------------------------------------------------------


def test_round_trip(cq: ConsumeQueues) -> None:
    fill(cq, "orders", 0, 3)
    fill(cq, "orders", 1, 2)
    assert cq.entries("orders", 0, 0, 32) == expected(0, 3)
    assert cq.entries("orders", 0, 1, 1) == expected(1, 2)
    assert cq.entries("orders", 1, 0, 32) == expected(0, 2)
    assert cq.min_offset("orders", 0) == 0
    assert cq.max_offset("orders", 0) == 3
    assert cq.last_entry("orders", 0) == QueueEntry(2, 207, 12, 2)
    assert cq.queues() == [("orders", 0), ("orders", 1)]
    assert cq.max_offsets() == {("orders", 0): 3, ("orders", 1): 2}


def test_unknown_queue_and_out_of_range_reads_are_empty(cq: ConsumeQueues) -> None:
    assert cq.entries("nope", 0, 0, 10) == []
    assert cq.last_entry("nope", 0) is None
    assert (cq.min_offset("nope", 0), cq.max_offset("nope", 0)) == (0, 0)
    fill(cq, "t", 0, 2)
    assert cq.entries("t", 0, 2, 10) == []
    assert cq.entries("t", 0, 0, 0) == []


def test_round_trip_survives_reopen(cq: ConsumeQueues) -> None:
    fill(cq, "t", 3, 6)
    cq = reopen(cq)
    assert cq.entries("t", 3, 0, 100) == expected(0, 6)
    fill(cq, "t", 3, 3, start=6)
    assert cq.entries("t", 3, 0, 100) == expected(0, 9)
    cq.close()


def test_queue_spanning_several_files(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 11)
    names = sorted(p.name for p in (cq.root / "t" / "0").iterdir())
    assert names == [f"{s:020d}" for s in (0, 4, 8)]
    assert cq.entries("t", 0, 2, 7) == expected(2, 9)  # crosses two file boundaries
    cq = reopen(cq)
    assert cq.entries("t", 0, 0, 100) == expected(0, 11)
    cq.close()


def test_flush_then_reopen_keeps_everything(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 5)
    cq.flush()
    fill(cq, "t", 0, 1, start=5)
    cq.flush()
    cq = reopen(cq)
    assert cq.entries("t", 0, 0, 10) == expected(0, 6)
    cq.close()


# -- idempotence and gaps ---------------------------------------------------


def test_reput_of_existing_entry_is_a_no_op(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 6)
    fill(cq, "t", 0, 6)  # recovery re-dispatches everything
    cq.put("t", 0, 2, 207, 12, 2)
    assert cq.entries("t", 0, 0, 100) == expected(0, 6)


def test_reput_with_different_content_overwrites_and_truncates(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 7)
    cq.put("t", 0, 3, 999, 5, 42)
    assert cq.max_offset("t", 0) == 4
    assert cq.entries("t", 0, 0, 100) == [*expected(0, 3), QueueEntry(3, 999, 5, 42)]
    cq = reopen(cq)
    assert cq.entries("t", 0, 0, 100) == [*expected(0, 3), QueueEntry(3, 999, 5, 42)]
    cq.close()


def test_gap_raises_queue_gap_error(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 3)
    with pytest.raises(QueueGapError) as caught:
        cq.put("t", 0, 5, 5000, 10, 0)
    assert (caught.value.expected, caught.value.got) == (3, 5)
    assert caught.value.code == "STORAGE_QUEUE_GAP"
    assert cq.max_offset("t", 0) == 3


def test_new_queue_may_start_at_any_offset(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 3, start=10)  # a rebuild after retention starts mid-way
    assert (cq.min_offset("t", 0), cq.max_offset("t", 0)) == (10, 13)
    cq = reopen(cq)
    assert cq.entries("t", 0, 0, 10) == expected(10, 13)
    assert (cq.min_offset("t", 0), cq.max_offset("t", 0)) == (10, 13)
    cq.close()


def test_bad_arguments_are_refused(cq: ConsumeQueues) -> None:
    with pytest.raises(InvalidArgument):
        cq.put("../evil", 0, 0, 0, 10, 0)
    with pytest.raises(InvalidArgument):
        cq.put("t", 0, 0, 0, 0, 0)  # an empty record cannot exist
    assert cq.queues() == []


# -- recovery and retention -------------------------------------------------


def test_truncate_from_drops_entries_at_or_after_offset(cq: ConsumeQueues) -> None:
    fill(cq, "a", 0, 10)
    fill(cq, "b", 0, 2)
    cq.truncate_from(507)  # entry 5 starts there
    assert cq.max_offsets() == {("a", 0): 5, ("b", 0): 2}
    assert cq.entries("a", 0, 0, 100) == expected(0, 5)
    assert not queue_file(cq.root, "a", 0, 8).exists()
    fill(cq, "a", 0, 5, start=5)
    cq = reopen(cq)
    assert cq.entries("a", 0, 0, 100) == expected(0, 10)
    cq.close()


def test_truncate_from_everything_keeps_queue_position(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 6, start=4)
    cq.truncate_from(0)
    assert (cq.min_offset("t", 0), cq.max_offset("t", 0)) == (4, 4)
    cq = reopen(cq)
    assert (cq.min_offset("t", 0), cq.max_offset("t", 0)) == (4, 4)
    with pytest.raises(QueueGapError):
        cq.put("t", 0, 5, 1, 1, 0)
    cq.close()


def test_trim_below_raises_min_offset_and_survives_reopen(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 10)
    cq.trim_below(600)  # entries 0..5 point below (5 starts at 507)
    assert cq.min_offset("t", 0) == 6
    assert cq.entries("t", 0, 0, 2) == expected(6, 8)  # reads below min start at min
    assert not queue_file(cq.root, "t", 0, 0).exists()
    assert queue_file(cq.root, "t", 0, 4).exists()  # holds 6 and 7
    cq = reopen(cq)
    assert (cq.min_offset("t", 0), cq.max_offset("t", 0)) == (6, 10)
    assert cq.entries("t", 0, 0, 100) == expected(6, 10)
    cq.close()


def test_trim_below_everything_keeps_newest_file_and_max(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 6)
    cq.trim_below(10**9)
    assert (cq.min_offset("t", 0), cq.max_offset("t", 0)) == (6, 6)
    assert cq.entries("t", 0, 0, 10) == []
    assert cq.last_entry("t", 0) is None
    cq = reopen(cq)
    assert (cq.min_offset("t", 0), cq.max_offset("t", 0)) == (6, 6)
    fill(cq, "t", 0, 1, start=6)
    assert cq.entries("t", 0, 0, 10) == expected(6, 7)
    cq.close()


def test_reput_of_trimmed_offset_is_ignored(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 6)
    cq.trim_below(300)
    cq.put("t", 0, 1, 107, 11, 1)
    assert cq.entries("t", 0, 0, 100) == expected(3, 6)


def test_lookup_by_time(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 9)
    stored_at = {100 * i + 7: 1_000 + 10 * i for i in range(9)}  # offset -> store time
    assert cq.lookup_by_time("t", 0, 0, stored_at.__getitem__) == 0
    assert cq.lookup_by_time("t", 0, 1_030, stored_at.__getitem__) == 3
    assert cq.lookup_by_time("t", 0, 1_031, stored_at.__getitem__) == 4
    assert cq.lookup_by_time("t", 0, 5_000, stored_at.__getitem__) == 9
    cq.trim_below(300)
    assert cq.lookup_by_time("t", 0, 0, stored_at.__getitem__) == 3
    assert cq.lookup_by_time("missing", 0, 0, stored_at.__getitem__) == 0


def test_reset_queue_and_delete_topic(cq: ConsumeQueues) -> None:
    fill(cq, "a", 0, 5)
    fill(cq, "a", 1, 5)
    fill(cq, "b", 0, 5)
    cq.reset_queue("a", 0)
    assert not (cq.root / "a" / "0").exists()
    assert cq.max_offset("a", 0) == 0
    fill(cq, "a", 0, 2, start=3)  # rebuild starts wherever the log starts
    assert cq.entries("a", 0, 0, 10) == expected(3, 5)
    cq.delete_topic("a")
    assert not (cq.root / "a").exists()
    assert cq.queues() == [("b", 0)]
    cq = reopen(cq)
    assert cq.queues() == [("b", 0)]
    cq.close()


def test_open_maps_stay_bounded(tmp_path: Path) -> None:
    cq = ConsumeQueues(tmp_path, entries_per_file=2, max_open_files=3)
    for queue_id in range(6):
        fill(cq, "t", queue_id, 7)
    assert cq.open_file_count() <= 3
    for queue_id in range(6):
        assert cq.entries("t", queue_id, 0, 100) == expected(0, 7)
    assert cq.open_file_count() <= 3
    cq.close()


# -- damage found on open ---------------------------------------------------


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


# -- model check ------------------------------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 5)),
        st.tuples(st.just("reput"), st.integers(0, 30)),
        st.tuples(st.just("overwrite"), st.integers(0, 30)),
        st.tuples(st.just("truncate"), st.integers(0, 3000)),
        st.tuples(st.just("trim"), st.integers(0, 3000)),
        st.tuples(st.just("reopen"), st.just(0)),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_matches_a_list_model(ops: list[tuple[str, int]]) -> None:
    """The model: a base offset plus the list of (commit-log offset, size, tag) after it."""
    with tempfile.TemporaryDirectory() as directory:
        cq = ConsumeQueues(Path(directory), entries_per_file=3)
        base, items = 0, []  # queue offset of items[0]
        next_offset = 0
        try:
            for name, arg in ops:
                if name == "append":
                    for _ in range(arg):
                        next_offset += 37
                        cq.put("t", 0, base + len(items), next_offset, 5, next_offset % 7)
                        items.append((next_offset, 5, next_offset % 7))
                elif name == "reput" and items:
                    i = arg % len(items)
                    cq.put("t", 0, base + i, *items[i])
                elif name == "overwrite" and items:
                    i = arg % len(items)
                    replacement = (items[i][0] + 1, 9, 1)
                    cq.put("t", 0, base + i, *replacement)
                    items[i:] = [replacement]
                    next_offset = max(next_offset, replacement[0])
                elif name == "truncate":
                    keep = [e for e in items if e[0] < arg]
                    if cq.queues():
                        items = keep
                    cq.truncate_from(arg)
                elif name == "trim":
                    dropped = len([e for e in items if e[0] < arg])
                    base, items = base + dropped, items[dropped:]
                    cq.trim_below(arg)
                elif name == "reopen":
                    cq.close()
                    cq = ConsumeQueues(Path(directory), entries_per_file=3)
                if not cq.queues():
                    continue
                assert cq.min_offset("t", 0) == base
                assert cq.max_offset("t", 0) == base + len(items)
                got = cq.entries("t", 0, 0, 1000)
                assert [(e.commit_log_offset, e.size, e.tag_hash) for e in got] == items
                assert [e.queue_offset for e in got] == list(range(base, base + len(items)))
        finally:
            cq.close()


def test_raw_entries_match_entries(cq: ConsumeQueues) -> None:
    fill(cq, "t", 0, 9)
    cq.trim_below(200)
    first, raw = cq.raw_entries("t", 0, 0, 5)
    assert first == 2
    assert raw == [(e.commit_log_offset, e.size, e.tag_hash) for e in expected(2, 7)]
    assert cq.raw_entries("missing", 0, 4, 5) == (4, [])
