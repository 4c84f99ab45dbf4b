from __future__ import annotations

from pathlib import Path

import pytest

from halfmoon.broker import (
    Broker,
    FakeClock,
    FilterSpec,
    GetStatus,
    IllegalOffset,
    IllegalQueueId,
    OffsetNotFound,
    OutgoingMessage,
)
from halfmoon.broker.filter import FilterExpressionError
from halfmoon.errors import InvalidArgument
from halfmoon.store.memory import MemoryStore


@pytest.fixture
def topic(broker: Broker) -> str:
    broker.create_topic("t", queue_count=1)
    broker.send(
        [
            OutgoingMessage("t", b"0", tag="a", properties={"n": "1", "region": "eu"}),
            OutgoingMessage("t", b"1", tag="b", properties={"n": "5"}),
            OutgoingMessage("t", b"2", tag="a", properties={"n": "10", "region": "us"}),
            OutgoingMessage("t", b"3"),
        ]
    )
    return "t"


def test_pull_all_then_nothing_new(broker: Broker, topic: str) -> None:
    first = broker.pull("g", topic, 0, 0, 3, FilterSpec())
    assert first.status is GetStatus.FOUND and [m.body for m in first.messages] == [
        b"0",
        b"1",
        b"2",
    ]
    assert (first.next_offset, first.min_offset, first.max_offset) == (3, 0, 4)
    assert (
        first.messages[0].properties == {"n": "1", "region": "eu"} and first.messages[0].tag == "a"
    )
    rest = broker.pull("g", topic, 0, first.next_offset, 10, FilterSpec())
    assert [m.body for m in rest.messages] == [b"3"]
    assert broker.pull("g", topic, 0, 4, 10, FilterSpec()).status is GetStatus.NO_MESSAGE
    assert broker.pull("g", topic, 0, 9, 10, FilterSpec()).status is GetStatus.OFFSET_OVERFLOW


def test_tag_filter(broker: Broker, topic: str) -> None:
    got = broker.pull("g", topic, 0, 0, 10, FilterSpec("TAG", "a"))
    assert [m.body for m in got.messages] == [b"0", b"2"] and got.next_offset == 4
    got = broker.pull("g", topic, 0, 0, 10, FilterSpec("TAG", "b || zz"))
    assert [m.body for m in got.messages] == [b"1"]
    none = broker.pull("g", topic, 0, 0, 10, FilterSpec("TAG", "zz"))
    assert none.status is GetStatus.NO_MATCHED_MESSAGE and none.next_offset == 4


def test_sql92_filter(broker: Broker, topic: str) -> None:
    got = broker.pull("g", topic, 0, 0, 10, FilterSpec("SQL92", "n > 3"))
    assert [m.body for m in got.messages] == [b"1", b"2"]
    got = broker.pull("g", topic, 0, 0, 10, FilterSpec("SQL92", "region IS NULL OR region = 'eu'"))
    assert [m.body for m in got.messages] == [b"0", b"1", b"3"]
    with pytest.raises(FilterExpressionError) as info:
        broker.pull("g", topic, 0, 0, 10, FilterSpec("SQL92", "n >"))
    assert info.value.code == "ILLEGAL_FILTER_EXPRESSION"


def test_trimmed_offset_reports_the_new_minimum(
    broker: Broker, store: MemoryStore, topic: str
) -> None:
    store.trim(topic, 0, 2)
    got = broker.pull("g", topic, 0, 0, 10, FilterSpec())
    assert got.status is GetStatus.OFFSET_TOO_SMALL and got.next_offset == 2 and got.min_offset == 2


def test_offsets_commit_and_validation(broker: Broker, topic: str) -> None:
    with pytest.raises(OffsetNotFound) as info:
        broker.get_offset("g", topic, 0)
    assert info.value.code == "OFFSET_NOT_FOUND"
    broker.update_offset("g", topic, 0, 3)
    assert broker.get_offset("g", topic, 0) == 3
    with pytest.raises(IllegalOffset):
        broker.update_offset("g", topic, 0, 99)
    with pytest.raises(IllegalOffset):
        broker.pull("g", topic, 0, -1, 1, FilterSpec())
    with pytest.raises(IllegalQueueId):
        broker.get_offset("g", topic, 5)
    progress = broker.group_progress("g", topic)
    assert [(p.queue_id, p.committed_offset, p.max_offset, p.lag) for p in progress] == [
        (0, 3, 4, 1)
    ]


def test_offsets_persist(store: MemoryStore, clock: FakeClock, tmp_path: Path) -> None:
    first = Broker(store, tmp_path, clock=clock)
    first.create_topic("t", queue_count=2)
    first.send([OutgoingMessage("t", b"x", queue_id=1)])
    first.update_offset("g", "t", 1, 1)
    first.close()
    assert Broker(store, tmp_path, clock=clock).get_offset("g", "t", 1) == 1


def test_offsets_persist_periodically_on_tick(
    store: MemoryStore, clock: FakeClock, tmp_path: Path
) -> None:
    first = Broker(store, tmp_path, clock=clock)
    first.create_topic("t", queue_count=1)
    first.send([OutgoingMessage("t", b"x")])
    first.update_offset("g", "t", 0, 1)
    first.tick()
    assert (
        not (tmp_path / "offsets.json").exists()
        or Broker(store, tmp_path, clock=clock).offsets.get("g", "t", 0) is None
    )
    clock.advance(5_000)
    first.tick()  # interval passed: written without a close
    assert Broker(store, tmp_path, clock=clock).get_offset("g", "t", 0) == 1


def test_query_offset_by_policy_and_timestamp_and_reset(broker: Broker, clock: FakeClock) -> None:
    broker.create_topic("t", queue_count=1)
    start = clock.now_ms()
    for i in range(5):
        broker.send([OutgoingMessage("t", str(i).encode())])
        clock.advance(1_000)
    assert broker.query_offset("t", 0, "beginning") == 0
    assert broker.query_offset("t", 0, "end") == 5
    assert broker.query_offset("t", 0, "timestamp", start + 2_000) == 2
    assert broker.query_offset("t", 0, "timestamp", start + 2_500) == 3
    assert broker.query_offset("t", 0, "timestamp", start + 99_000) == 5
    with pytest.raises(Exception) as info:
        broker.query_offset("t", 0, "middle")
    assert info.value.code == "BAD_REQUEST"  # type: ignore[attr-defined]
    assert broker.reset_offset("g", "t", start + 3_000) == {0: 3}
    assert broker.get_offset("g", "t", 0) == 3


# -- bulk reads (halfmoon.v1.BulkRead's broker side) --------------------------------------------


def test_bulk_read_stops_at_the_count_the_bytes_and_the_end_offset(
    broker: Broker, topic: str
) -> None:
    everything = broker.bulk_read("g", topic, 0, 0, 100, 1 << 20, FilterSpec())
    assert [m.body for m in everything.messages] == [b"0", b"1", b"2", b"3"]
    assert everything.next_offset == 4
    two = broker.bulk_read("g", topic, 0, 1, 2, 1 << 20, FilterSpec())
    assert [m.queue_offset for m in two.messages] == [1, 2] and two.next_offset == 3
    # One byte is less than any message: the answer still carries one, so a reader moves on.
    tiny = broker.bulk_read("g", topic, 0, 0, 100, 1, FilterSpec())
    assert [m.body for m in tiny.messages] == [b"0"] and tiny.next_offset == 1
    ranged = broker.bulk_read("g", topic, 0, 1, 100, 1 << 20, FilterSpec(), end_offset=3)
    assert [m.queue_offset for m in ranged.messages] == [1, 2] and ranged.next_offset == 3
    empty = broker.bulk_read("g", topic, 0, 2, 100, 1 << 20, FilterSpec(), end_offset=2)
    assert empty.messages == [] and empty.next_offset == 2


def test_bulk_read_filters_never_answer_past_the_end_offset(broker: Broker, topic: str) -> None:
    # Tag "a" is at offsets 0 and 2; [1, 2) holds only a "b": nothing, and next_offset is 2.
    got = broker.bulk_read("g", topic, 0, 1, 100, 1 << 20, FilterSpec("TAG", "a"), end_offset=2)
    assert got.messages == [] and got.next_offset == 2
    assert got.status is GetStatus.NO_MATCHED_MESSAGE
    got = broker.bulk_read("g", topic, 0, 0, 100, 1 << 20, FilterSpec("SQL92", "n > 3"))
    assert [m.body for m in got.messages] == [b"1", b"2"] and got.next_offset == 4


def test_bulk_read_reports_retention_and_bounds(
    broker: Broker, store: MemoryStore, topic: str
) -> None:
    store.trim(topic, 0, 2)
    gone = broker.bulk_read("g", topic, 0, 0, 100, 1 << 20, FilterSpec())
    assert gone.status is GetStatus.OFFSET_TOO_SMALL and gone.next_offset == 2
    assert gone.min_offset == 2 and gone.messages == []
    assert broker.bulk_read("g", topic, 0, 9, 10, 100, FilterSpec()).status is (
        GetStatus.OFFSET_OVERFLOW
    )


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((0, -1, 10, 100, None), IllegalOffset),
        ((0, 0, 0, 100, None), InvalidArgument),
        ((0, 0, 16385, 100, None), InvalidArgument),
        ((0, 0, 10, 0, None), InvalidArgument),
        ((0, 0, 10, 16 * 1024 * 1024 + 1, None), InvalidArgument),
        ((0, 3, 10, 100, 2), IllegalOffset),
        ((7, 0, 10, 100, None), IllegalQueueId),
    ],
)
def test_bulk_read_refuses_bad_requests(
    broker: Broker, topic: str, args: tuple[int, int, int, int, int | None], error: type
) -> None:
    queue, offset, count, size, end = args
    with pytest.raises(error):
        broker.bulk_read("g", topic, queue, offset, count, size, FilterSpec(), end_offset=end)
