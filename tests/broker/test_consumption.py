"""Per-queue consumption state: committed offset, in-flight entries, bounded memory, snapshots."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from halfmoon.broker.consumption import (
    REQUEUED_VISIBLE_AT,
    QueueConsumption,
    TopicConsumption,
    read_snapshot,
    write_snapshot,
)
from halfmoon.errors import CorruptionError


def deliver(queue: QueueConsumption, count: int, visible_at: int = 100, epoch0: int = 1000) -> None:
    for _ in range(count):
        offset = queue.cursor
        queue.deliver(offset, offset * 10, visible_at, epoch0 + offset, ordered=False)
        queue.move_cursor(offset + 1)


def test_committed_is_the_lowest_offset_still_in_flight() -> None:
    queue = QueueConsumption(5)
    deliver(queue, 4)  # 5..8
    assert (queue.committed, queue.cursor) == (5, 9)
    queue.complete(7)
    queue.complete(6)
    assert queue.committed == 5
    queue.complete(5)
    assert queue.committed == 8
    queue.complete(8)
    assert queue.committed == 9


def test_skipped_offsets_count_as_done() -> None:
    queue = QueueConsumption(0)
    queue.move_cursor(10)  # ten filtered-out messages
    assert queue.committed == 10
    deliver(queue, 1)
    queue.move_cursor(20)
    assert (queue.committed, queue.cursor) == (10, 20)
    queue.complete(10)
    assert queue.committed == 20


def test_memory_stays_bounded_by_messages_in_flight() -> None:
    """A stuck first message and a million acks above it cost O(in flight), not O(span)."""
    queue = QueueConsumption(0)
    deliver(queue, 1)  # offset 0 stays in flight throughout
    rng = random.Random(7)
    for _ in range(2000):
        start = queue.cursor
        deliver(queue, 50)
        offsets = list(range(start, start + 50))
        rng.shuffle(offsets)
        for offset in offsets:
            queue.hide(offset, 500, 10**9 + offset)  # churn the timer too
            queue.complete(offset)
    assert queue.cursor == 100_001
    assert queue.committed == 0
    assert len(queue.inflight) == 1
    assert len(queue._order) <= 2 * 1 + 64 + 1
    assert len(queue._heap) <= 2 * 1 + 64 + 1
    queue.complete(0)
    assert queue.committed == queue.cursor


def test_take_expired_orders_by_time_or_offset() -> None:
    queue = QueueConsumption(0)
    for offset, visible_at in enumerate([30, 10, 20, 99]):
        queue.deliver(offset, offset, visible_at, offset, ordered=False)
    queue.move_cursor(4)
    by_time = queue.take_expired(now=30, limit=2, by_offset=False)
    assert [o for o, _ in by_time] == [1, 2]
    for offset, _ in by_time:
        queue.requeue(offset)
    by_offset = queue.take_expired(now=30, limit=2, by_offset=True)
    assert [o for o, _ in by_offset] == [0, 1]
    # Offset 2 was expired but beyond the limit: it stays on the timer.
    assert [o for o, _ in queue.take_expired(now=30, limit=5, by_offset=True)] == [2]
    assert queue.take_expired(now=98, limit=5, by_offset=False) == []


def test_stale_timer_entries_are_ignored() -> None:
    queue = QueueConsumption(0)
    queue.deliver(0, 0, 10, epoch=1, ordered=False)
    queue.move_cursor(1)
    queue.hide(0, 50, epoch=2)
    assert queue.next_visible_at() == 50
    assert queue.take_expired(now=20, limit=5, by_offset=False) == []
    entry = queue.redeliver(0, 80, epoch=3)
    assert (entry.attempt, entry.epoch, entry.visible_at) == (2, 3, 80)
    assert queue.next_visible_at() == 80


def test_fifo_blocked_only_by_ordered_messages_still_invisible() -> None:
    queue = QueueConsumption(0)
    queue.deliver(0, 0, 100, 1, ordered=False)
    assert not queue.fifo_blocked(now=0)
    queue.deliver(1, 1, 100, 2, ordered=True)
    assert queue.fifo_blocked(now=99)
    assert not queue.fifo_blocked(now=100)
    queue.complete(1)
    assert not queue.fifo_blocked(now=0)


def test_json_round_trip_makes_in_flight_visible_and_keeps_attempts() -> None:
    queue = QueueConsumption(3)
    deliver(queue, 4, visible_at=10_000)  # 3..6
    queue.redeliver(4, 20_000, 77)
    queue.complete(5)
    data = json.loads(json.dumps(queue.to_json()))
    restored = QueueConsumption.from_json(data)
    assert (restored.committed, restored.cursor) == (3, 7)
    assert sorted(restored.inflight) == [3, 4, 6]
    assert restored.inflight[4].attempt == 2
    assert restored.inflight[4].epoch == 77
    assert restored.next_visible_at() == 0
    assert [o for o, _ in restored.take_expired(now=0, limit=10, by_offset=True)] == [3, 4, 6]


def test_snapshot_file_round_trip(tmp_path: Path) -> None:
    state = TopicConsumption("g", "t")
    queue = state.queues[2] = QueueConsumption(0)
    deliver(queue, 3)
    queue.complete(1)
    path = tmp_path / "meta" / "consumption.json"
    write_snapshot(path, b"\x01" * 16, 12345, [state.to_json()])
    assert not path.with_name(path.name + ".tmp").exists()
    snapshot = read_snapshot(path)
    assert snapshot is not None
    assert (snapshot.receipt_key, snapshot.next_epoch) == (b"\x01" * 16, 12345)
    (restored,) = snapshot.topics
    assert (restored.group, restored.topic) == ("g", "t")
    assert sorted(restored.queues[2].inflight) == [0, 2]
    assert read_snapshot(tmp_path / "missing.json") is None


def test_snapshot_replaces_the_old_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "consumption.json"
    write_snapshot(path, b"k" * 16, 1, [])
    # A leftover temp file from a crash mid-write does not matter.
    path.with_name(path.name + ".tmp").write_text("{garbage")
    write_snapshot(path, b"k" * 16, 2, [])
    snapshot = read_snapshot(path)
    assert snapshot is not None and snapshot.next_epoch == 2


@pytest.mark.parametrize("content", ["{not json", '{"version": 99}', '{"version": 1}', "[]"])
def test_unreadable_snapshot_is_reported(tmp_path: Path, content: str) -> None:
    path = tmp_path / "consumption.json"
    path.write_text(content)
    with pytest.raises(CorruptionError) as caught:
        read_snapshot(path)
    assert "move it aside" in caught.value.message


@pytest.mark.parametrize("seed", range(20))
def test_the_visible_and_retrying_counts_match_a_walk_of_every_entry(seed: int) -> None:
    """The counts a queue's status asks for (visible again; past the first delivery) are kept
    without walking the in-flight table: after any mix of deliveries, redeliveries, requeues,
    renewals, acks, releases and restarts they equal that walk."""
    rng = random.Random(seed)
    queue = QueueConsumption(0)
    epochs = iter(range(10_000, 10**9))
    next_offset = 0
    for step in range(600):
        now = step * 10
        live = sorted(queue.inflight)
        action = rng.random()
        if action < 0.3 or not live:
            queue.deliver(next_offset, next_offset * 100, now + rng.choice((5, 50, 5000)),
                          next(epochs), False, rng.choice(("", "proxy-1")))  # fmt: skip
            next_offset += 1
            queue.move_cursor(next_offset)
        elif action < 0.45:
            for offset, _ in queue.take_expired(now, rng.randint(1, 5), rng.random() < 0.5):
                if rng.random() < 0.7:
                    queue.redeliver(offset, now + rng.choice((5, 5000)), next(epochs))
                else:
                    queue.requeue(offset)
        elif action < 0.6:  # a nack or a change of invisible time
            queue.hide(rng.choice(live), rng.choice((REQUEUED_VISIBLE_AT, now + 40)), next(epochs))
        elif action < 0.8:
            queue.complete(rng.choice(live))
        elif action < 0.85:
            queue.release("proxy-1", epochs)
        elif action < 0.9:
            queue.defer(next_offset, next_offset * 100, now + 30, next(epochs), False)
            next_offset += 1
            queue.move_cursor(next_offset)
        elif action < 0.95:  # a restart: the snapshot read back
            queue = QueueConsumption.from_json(json.loads(json.dumps(queue.to_json())))
        else:
            queue.restore([rng.choice(live), rng.randint(0, 4), next(epochs), 0, 0])
        for at in (now, now + 45, now + 6000):
            walked = sum(1 for e in queue.inflight.values() if e.visible_at <= at)
            assert queue.visible_count(at) == walked, (seed, step, at)
        assert queue.retrying == sum(1 for e in queue.inflight.values() if e.attempt > 1)
