from __future__ import annotations

from pathlib import Path

import pytest

from halfmoon.broker import (
    Broker,
    BrokerConfig,
    FakeClock,
    FilterSpec,
    IllegalTopic,
    MessageType,
    OutgoingMessage,
    PermissionDenied,
    TopicExists,
    TopicNotFound,
)
from halfmoon.store.memory import MemoryStore


def test_create_get_list_and_delete(broker: Broker) -> None:
    created = broker.create_topic("orders", MessageType.FIFO, queue_count=4)
    assert created.queue_count == 4 and created.message_type is MessageType.FIFO
    assert broker.get_topic("orders") == created
    assert [t.name for t in broker.list_topics()] == ["orders"]  # internal topics hidden
    with pytest.raises(TopicExists) as info:
        broker.create_topic("orders")
    assert info.value.code == "TOPIC_EXISTS"
    broker.delete_topic("orders")
    with pytest.raises(TopicNotFound) as info:
        broker.get_topic("orders")
    assert info.value.code == "TOPIC_NOT_FOUND"


@pytest.mark.parametrize("name", ["%DLQ%g", "%HM_TIMER%", "RMQ_SYS_TRANS_HALF_TOPIC", "%x"])
def test_reserved_names_cannot_be_created(broker: Broker, name: str) -> None:
    with pytest.raises(IllegalTopic) as info:
        broker.create_topic(name)
    assert info.value.code == "ILLEGAL_TOPIC"
    assert "reserved" in info.value.message


@pytest.mark.parametrize("name", ["", "a b", "x" * 128, "tópico"])
def test_illegal_names_are_refused(broker: Broker, name: str) -> None:
    with pytest.raises(IllegalTopic):
        broker.create_topic(name)


def test_auto_create_is_off_by_default_and_on_when_configured(
    store: MemoryStore, clock: FakeClock
) -> None:
    with pytest.raises(TopicNotFound):
        Broker(store, None, clock=clock).get_topic("auto")
    auto = Broker(store, None, BrokerConfig(auto_create_topics=True, default_queue_count=3), clock)
    topic = auto.get_topic("auto")
    assert topic.queue_count == 3 and topic.message_type is MessageType.MIXED
    with pytest.raises(TopicNotFound):  # never for reserved names
        auto.get_topic("%DLQ%nope")


@pytest.mark.parametrize(
    ("topic_type", "accepted"),
    [
        (MessageType.NORMAL, {MessageType.NORMAL}),
        (MessageType.FIFO, {MessageType.FIFO}),
        (MessageType.DELAY, {MessageType.DELAY}),
        (MessageType.TRANSACTION, {MessageType.TRANSACTION}),
        (
            MessageType.MIXED,
            {MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION},
        ),
    ],
)
def test_route_lists_accepted_message_types(
    broker: Broker, topic_type: MessageType, accepted: set[MessageType]
) -> None:
    broker.create_topic("t", topic_type, queue_count=2)
    routes = broker.route("t")
    assert [r.queue_id for r in routes] == [0, 1]
    assert all(set(r.accepted_types) == accepted and r.perm == "rw" for r in routes)


def test_growing_adds_queues_and_shrinking_keeps_removed_queues_readable(
    broker: Broker, store: MemoryStore
) -> None:
    broker.create_topic("t", queue_count=2)
    broker.update_topic("t", queue_count=4)
    assert [r.queue_id for r in broker.route("t")] == [0, 1, 2, 3]
    broker.send([OutgoingMessage("t", b"in-3", queue_id=3)])
    shrunk = broker.update_topic("t", queue_count=2)
    # queues 2 and 3 become read-only; 3 holds a message, so both stay until it is gone
    assert shrunk.read_queue_count == 4
    perms = {r.queue_id: r.perm for r in broker.route("t")}
    assert perms == {0: "rw", 1: "rw", 2: "r", 3: "r"}
    with pytest.raises(Exception) as info:
        broker.send([OutgoingMessage("t", b"x", queue_id=3)])
    assert info.value.code == "BAD_REQUEST"  # type: ignore[attr-defined]
    pulled = broker.pull("g", "t", 3, 0, 10, FilterSpec())
    assert [m.body for m in pulled.messages] == [b"in-3"]
    store.trim("t", 3, 1)  # retention removes the last message
    broker.update_topic("t", perm="rw")
    assert [r.queue_id for r in broker.route("t")] == [0, 1]


def test_write_to_read_only_topic_is_refused(broker: Broker) -> None:
    broker.create_topic("ro", perm="r")
    with pytest.raises(PermissionDenied) as info:
        broker.send([OutgoingMessage("ro", b"x")])
    assert info.value.code == "FORBIDDEN"
    broker.update_topic("ro", perm="rw")
    assert broker.send([OutgoingMessage("ro", b"x")])[0].queue_offset == 0


def test_metadata_survives_close_and_reopen(
    store: MemoryStore, clock: FakeClock, tmp_path: Path
) -> None:
    first = Broker(store, tmp_path, clock=clock)
    first.create_topic("a", MessageType.DELAY, queue_count=3, perm="r")
    first.create_topic("b", MessageType.MIXED, queue_count=1)
    first.close()
    second = Broker(store, tmp_path, clock=clock)
    assert [(t.name, t.message_type, t.queue_count, t.perm) for t in second.list_topics()] == [
        ("a", MessageType.DELAY, 3, "r"),
        ("b", MessageType.MIXED, 1, "rw"),
    ]
    assert not list(tmp_path.glob("*.tmp"))


def test_topic_status_reports_offsets_and_last_store_time(broker: Broker, clock: FakeClock) -> None:
    broker.create_topic("t", queue_count=2)
    broker.send([OutgoingMessage("t", b"x", queue_id=1), OutgoingMessage("t", b"y", queue_id=1)])
    status = {s.queue_id: s for s in broker.topic_status("t")}
    assert (status[0].min_offset, status[0].max_offset, status[0].last_store_timestamp) == (
        0,
        0,
        None,
    )
    assert (status[1].max_offset, status[1].last_store_timestamp) == (2, clock.now_ms())


def test_shrinking_drops_removed_queues_that_never_held_messages(broker: Broker) -> None:
    broker.create_topic("t", queue_count=4)
    broker.send([OutgoingMessage("t", b"x", queue_id=2)])
    assert broker.update_topic("t", queue_count=1).read_queue_count == 3  # 3 empty: dropped
    assert {r.queue_id: r.perm for r in broker.route("t")} == {0: "rw", 1: "r", 2: "r"}
    assert broker.update_topic("t", queue_count=3).read_queue_count == 3
    assert {r.perm for r in broker.route("t")} == {"rw"}


def test_the_parked_transactions_topic_is_reserved_and_hidden():
    from halfmoon.broker.topics import IllegalTopic, check_topic_name, is_internal_topic

    with pytest.raises(IllegalTopic):
        check_topic_name("TRANS_CHECK_MAX_TIME_TOPIC")
    assert is_internal_topic("TRANS_CHECK_MAX_TIME_TOPIC")
    assert is_internal_topic("RMQ_SYS_TRANS_HALF_TOPIC")
    assert not is_internal_topic("%DLQ%billing")  # dead letters are consumable


def test_a_reserved_name_allowed_once_is_still_refused_without_leave() -> None:
    """Legal names are remembered so each send does not match them again; a reserved one
    checked with ``allow_reserved`` must not be remembered as legal for everyone."""
    from halfmoon.broker.errors import IllegalTopic
    from halfmoon.broker.topics import check_topic_name

    check_topic_name("%RETRY%remembered-group", allow_reserved=True)
    with pytest.raises(IllegalTopic):
        check_topic_name("%RETRY%remembered-group")
    check_topic_name("plain-remembered")
    check_topic_name("plain-remembered")  # the remembered path
    with pytest.raises(IllegalTopic):
        check_topic_name("bad name")
    with pytest.raises(IllegalTopic):
        check_topic_name("bad name")
