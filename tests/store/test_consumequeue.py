"""Consume queues on real files: round trips, idempotence, retention, a model check.

What opening does with damaged files is in test_queuerepair.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from halfmoon.errors import InvalidArgument
from halfmoon.store.consumequeue import ConsumeQueues, QueueEntry, QueueGapError
from tests.store.queueutil import expected, fill, queue_file, reopen


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
