"""The due index on its own: order, invalidation, lanes, compaction, and the work it does."""

from __future__ import annotations

from halfmoon.broker.transactions.due_index import COMPACT_SLACK, DueIndex
from halfmoon.broker.transactions.records import PendingTxn


def txn(half_offset: int, topic: str = "orders", group: str | None = "pg") -> PendingTxn:
    return PendingTxn(
        half_offset=half_offset,
        half_end=half_offset + 100,
        topic=topic,
        queue_id=0,
        message_id=f"m{half_offset}",
        keys=(),
        producer_group=group,
        group=None,
        stored_ms=0,
        due_ms=0,
    )


def drain(index: DueIndex, now_ms: int) -> list[int]:
    """Every due entry, lane by lane, as a scan takes them (then the lanes go back)."""
    taken = []
    for lane in index.due_lanes(now_ms):
        while (entry := index.pop_due(lane, now_ms)) is not None:
            taken.append(entry.half_offset)
        index.reschedule(lane)
    return taken


def test_entries_come_out_by_due_time_then_offset_and_only_once_due() -> None:
    index = DueIndex()
    for offset, due in [(500, 30), (100, 10), (300, 20), (200, 10), (400, 40)]:
        index.add(txn(offset), due)
    assert index.next_due_ms() == 10
    assert drain(index, 9) == []
    assert drain(index, 20) == [100, 200, 300]
    assert len(index) == 2  # taken entries are out of the index until added back
    assert drain(index, 100) == [500, 400]
    assert len(index) == 0 and drain(index, 1_000) == []


def test_discarded_entries_never_come_out_and_a_new_key_replaces_the_old() -> None:
    index = DueIndex()
    a, b, c = txn(1), txn(2), txn(3)
    for entry in (a, b, c):
        index.add(entry, 10)
    index.discard(b)  # committed
    index.discard(b)  # twice is harmless
    index.add(c, 50)  # checked: due again later
    assert b not in index and c in index and len(index) == 2
    assert drain(index, 10) == [1]
    assert drain(index, 49) == []
    assert drain(index, 50) == [3]


def test_lanes_are_due_on_their_own() -> None:
    index = DueIndex()
    index.add(txn(1, topic="a"), 10)
    index.add(txn(2, topic="b"), 20)
    index.add(txn(3, topic="a", group=None), 5)
    assert index.due_lanes(4) == []
    assert index.due_lanes(10) == [(None, "a"), ("pg", "a")]
    # A lane taken by a scan is off the schedule until it is put back.
    assert index.due_lanes(10) == []
    assert index.pop_due(("pg", "a"), 10) is not None
    index.reschedule(("pg", "a"))  # now empty: forgotten
    index.reschedule((None, "a"))  # its entry still there: back on the schedule
    assert index.due_lanes(100) == [(None, "a"), ("pg", "b")]


def test_a_lane_left_early_keeps_its_due_entries_for_the_next_scan() -> None:
    index = DueIndex()
    for offset in range(10):
        index.add(txn(offset), 10)
    (lane,) = index.due_lanes(10)
    first = index.pop_due(lane, 10)
    assert first is not None
    index.reschedule(lane)  # refused after one: the other nine stay
    index.add(first, 10)  # the one taken but not sent goes back as it was
    assert sorted(drain(index, 10)) == list(range(10))


def test_a_lane_heap_is_compacted_when_mostly_dead() -> None:
    index = DueIndex()
    entries = [txn(offset) for offset in range(10_000)]
    for entry in entries:
        index.add(entry, 1_000_000)  # long immunity: nothing surfaces for a while
    for entry in entries[:-10]:
        index.discard(entry)  # decided long before due
    lane = index._lanes[("pg", "orders")]
    assert len(lane.heap) <= 2 * 10 + COMPACT_SLACK + 1
    assert drain(index, 1_000_000) == [e.half_offset for e in entries[-10:]]


def test_finding_what_is_due_costs_what_is_due_not_what_is_pending() -> None:
    index = DueIndex()
    for offset in range(20_000):  # pending, due in an hour, over 20 lanes
        index.add(txn(offset, topic=f"t{offset % 20}"), 3_600_000)
    for offset in range(20_000, 20_005):
        index.add(txn(offset, topic="t0"), 100)
    before = index.work
    assert index.due_lanes(99) == []
    assert index.work == before  # nothing due: not one item looked at
    assert drain(index, 100) == list(range(20_000, 20_005))
    # Five due entries: one schedule pop, five pops, a reschedule; nothing of the 20,000.
    assert index.work - before <= 10
