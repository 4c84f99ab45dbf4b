from __future__ import annotations

import pytest

from halfmoon.broker import FakeClock
from halfmoon.errors import InvalidArgument, NotFound
from halfmoon.store import record
from halfmoon.store.api import GetStatus, Store
from halfmoon.store.memory import MemoryStore
from halfmoon.store.message import PROPERTY_KEYS, PROPERTY_TAGS, Message, tag_hash


def msg(topic: str = "T", queue_id: int = 0, tag: str | None = None, **props: str) -> Message:
    properties = dict(props)
    if tag:
        properties[PROPERTY_TAGS] = tag
    return Message(topic=topic, body=b"body", queue_id=queue_id, properties=properties)


def test_satisfies_the_store_protocol(store: MemoryStore) -> None:
    assert isinstance(store, Store)


def test_offsets_are_dense_per_queue_and_commit_log_offsets_use_real_record_sizes(
    store: MemoryStore,
) -> None:
    results = store.append([msg(queue_id=0), msg(queue_id=1), msg(queue_id=0)])
    assert [r.queue_offset for r in results] == [0, 0, 1]
    size = len(record.encode(msg(), 0, 0, 0, "127.0.0.1:8081"))
    assert [r.commit_log_offset for r in results] == [0, size, 2 * size]
    assert results[0].end_offset == size
    assert store.max_offset("T", 0) == 2 and store.min_offset("T", 0) == 0
    assert store.read_at(size).queue_id == 1
    assert store.durable(results[-1].end_offset).done()


def test_invalid_message_rejects_the_whole_batch(store: MemoryStore) -> None:
    with pytest.raises(InvalidArgument) as info:
        store.append([msg(), Message(topic="bad topic!", body=b"")])
    assert info.value.code == "ILLEGAL_TOPIC"
    with pytest.raises(InvalidArgument) as info:
        store.append([msg(**{"k": "a\x01b"})])
    assert info.value.code == "ILLEGAL_MESSAGE_PROPERTY_VALUE"
    assert store.max_offset("T", 0) == 0


def test_get_statuses(store: MemoryStore) -> None:
    assert store.get("T", 0, 0).status is GetStatus.NO_SUCH_QUEUE
    store.append([msg() for _ in range(5)])
    found = store.get("T", 0, 1, max_messages=2)
    assert found.status is GetStatus.FOUND
    assert [m.queue_offset for m in found.messages] == [1, 2]
    assert found.next_offset == 3
    assert store.get("T", 0, 5).status is GetStatus.NO_MESSAGE
    overflow = store.get("T", 0, 9)
    assert overflow.status is GetStatus.OFFSET_OVERFLOW and overflow.next_offset == 5
    store.trim("T", 0, 3)
    small = store.get("T", 0, 1)
    assert small.status is GetStatus.OFFSET_TOO_SMALL
    assert (small.next_offset, small.min_offset, small.max_offset) == (3, 3, 5)
    with pytest.raises(NotFound) as info:
        store.read_at(0)
    assert info.value.code == "MESSAGE_NOT_FOUND"


def test_tag_hash_and_predicate_filters_skip_entries(store: MemoryStore) -> None:
    store.append([msg(tag="a"), msg(tag="b"), msg(tag="a", color="red"), msg(tag="c")])
    got = store.get("T", 0, 0, tag_hashes=frozenset({tag_hash("a")}))
    assert [m.queue_offset for m in got.messages] == [0, 2]
    got = store.get("T", 0, 0, predicate=lambda m: m.properties.get("color") == "red")
    assert [m.queue_offset for m in got.messages] == [2]
    assert got.next_offset == 4
    none = store.get("T", 0, 0, tag_hashes=frozenset({tag_hash("zzz")}))
    assert none.status is GetStatus.NO_MATCHED_MESSAGE and none.next_offset == 4


def test_listeners_are_called_and_a_failing_listener_does_not_break_appends(
    store: MemoryStore,
) -> None:
    seen = []

    def bad(result: object) -> None:
        raise RuntimeError("boom")

    store.add_listener(bad)
    store.add_listener(lambda r: seen.append((r.topic, r.queue_id, r.queue_offset)))
    store.append([msg(queue_id=2)])
    assert seen == [("T", 2, 0)]


def test_timestamps_keys_and_stats() -> None:
    clock = FakeClock(1_000)
    store = MemoryStore(clock.now_ms)
    store.append([msg()])
    clock.advance(100)
    store.append([Message("T", b"x", 0, {PROPERTY_KEYS: "k1 k2"})])
    assert store.offset_for_timestamp("T", 0, 1_050) == 1
    assert store.offset_for_timestamp("T", 0, 0) == 0
    assert store.offset_for_timestamp("T", 0, 5_000) == 2
    assert [m.queue_offset for m in store.query_by_key("T", "k2")] == [1]
    assert store.stats().queues == 1
    store.delete_topic("T")
    assert store.max_offset("T", 0) == 0 and list(store.queues()) == []
