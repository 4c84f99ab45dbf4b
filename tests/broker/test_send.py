from __future__ import annotations

import hashlib
import zlib

import pytest

from halfmoon.broker import (
    BodyDigestMismatch,
    Broker,
    FakeClock,
    FilterSpec,
    MessageBodyTooLarge,
    MessageType,
    OutgoingMessage,
    verify_body_digest,
)
from halfmoon.broker.queue_select import queue_for_group
from halfmoon.store.memory import MemoryStore


def out(topic: str = "t", body: bytes = b"x", **kw: object) -> OutgoingMessage:
    return OutgoingMessage(topic, body, **kw)  # type: ignore[arg-type]


def test_send_returns_ids_and_offsets_round_robin(broker: Broker, store: MemoryStore) -> None:
    broker.create_topic("t", queue_count=3)
    results = broker.send([out(tag="a", keys=["k"]), out(message_id="client-id"), out(), out()])
    assert [r.queue_id for r in results] == [0, 1, 2, 0]
    assert [r.queue_offset for r in results] == [0, 0, 0, 1]
    assert results[1].message_id == "client-id" and len(results[0].message_id) == 34
    assert results[-1].end_offset == store.stats().commit_log_max_offset
    stored = store.read_at(results[0].commit_log_offset)
    assert stored.tags == "a" and stored.keys == ["k"]


@pytest.mark.parametrize(
    ("topic_type", "message", "code"),
    [
        (
            MessageType.NORMAL,
            out(message_type=MessageType.FIFO, message_group="g"),
            "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE",
        ),
        (MessageType.FIFO, out(), "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"),
        (
            MessageType.FIFO,
            out(message_type=MessageType.FIFO),
            "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE",
        ),
        (
            MessageType.DELAY,
            out(message_type=MessageType.DELAY),
            "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE",
        ),
        (MessageType.TRANSACTION, out(), "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"),
        (MessageType.MIXED, out(message_group="g"), "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"),
        (MessageType.MIXED, out(delivery_timestamp=5), "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"),
        (
            MessageType.DELAY,
            out(message_type=MessageType.DELAY, delivery_timestamp=2**62),
            "ILLEGAL_DELIVERY_TIME",
        ),
        (MessageType.NORMAL, out(tag="a||b"), "ILLEGAL_MESSAGE_TAG"),
        (MessageType.NORMAL, out(tag=" "), "ILLEGAL_MESSAGE_TAG"),
        (MessageType.NORMAL, out(keys=["two words"]), "ILLEGAL_MESSAGE_KEY"),
        (MessageType.NORMAL, out(properties={"TAGS": "x"}), "ILLEGAL_MESSAGE_PROPERTY_KEY"),
        (MessageType.NORMAL, out(body=b"x" * (4 * 1024 * 1024 + 1)), "MESSAGE_BODY_TOO_LARGE"),
        (MessageType.NORMAL, out(queue_id=9), "BAD_REQUEST"),
        (MessageType.NORMAL, out(topic="nope"), "TOPIC_NOT_FOUND"),
        (MessageType.NORMAL, out(topic="%HM_TIMER%"), "ILLEGAL_TOPIC"),
        (MessageType.NORMAL, out(properties={"big": "v" * 40_000}), "MESSAGE_PROPERTIES_TOO_LARGE"),
    ],
)
def test_validation_errors_have_stable_codes_and_write_nothing(
    broker: Broker, store: MemoryStore, topic_type: MessageType, message: OutgoingMessage, code: str
) -> None:
    broker.create_topic("t", topic_type, queue_count=2)
    good = (
        out(message_type=MessageType.FIFO, message_group="g")
        if topic_type is MessageType.FIFO
        else None
    )
    batch = [good, message] if good is not None else [message]
    with pytest.raises(Exception) as info:
        broker.send(batch)
    assert getattr(info.value, "code", None) == code, info.value
    assert store.stats().commit_log_max_offset == 0


def test_a_body_too_large_names_the_setting_whose_limit_it_passed(broker: Broker) -> None:
    # One rule (store/validate.py check_body_size) for the broker's limit and the store's.
    broker.create_topic("t")
    broker.update_config({"max_body_size": 8})
    with pytest.raises(MessageBodyTooLarge) as info:
        broker.send([out(body=b"nine byte")])
    assert info.value.code == "MESSAGE_BODY_TOO_LARGE"
    assert "9 bytes exceeds the limit of 8 bytes" in info.value.message
    assert info.value.message.endswith("raise broker.max_body_size")


@pytest.mark.parametrize(
    ("topic_type", "message_type", "extra"),
    [
        (MessageType.NORMAL, MessageType.NORMAL, {}),
        (MessageType.FIFO, MessageType.FIFO, {"message_group": "g"}),
        (MessageType.DELAY, MessageType.DELAY, {"delivery_timestamp": 1}),
        (MessageType.TRANSACTION, MessageType.TRANSACTION, {}),
        (MessageType.MIXED, MessageType.FIFO, {"message_group": "g"}),
        (MessageType.MIXED, MessageType.NORMAL, {}),
    ],
)
def test_each_topic_type_accepts_its_message_type(
    broker: Broker, topic_type: MessageType, message_type: MessageType, extra: dict
) -> None:
    broker.create_topic("t", topic_type)
    assert broker.send([out(message_type=message_type, **extra)])[0].queue_offset == 0


def test_fifo_same_group_same_queue_and_order_preserved(broker: Broker) -> None:
    broker.create_topic("f", MessageType.FIFO, queue_count=8)
    sends = [
        OutgoingMessage(
            "f", f"{group}-{i}".encode(), message_type=MessageType.FIFO, message_group=group
        )
        for i in range(20)
        for group in ("alpha", "beta", "gamma")
    ]
    results = broker.send(sends)
    for group in ("alpha", "beta", "gamma"):
        queues = {
            r.queue_id for r, m in zip(results, sends, strict=True) if m.message_group == group
        }
        assert queues == {queue_for_group(group, 8)}
    queue = queue_for_group("alpha", 8)
    bodies = [m.body for m in broker.pull("c", "f", queue, 0, 100, FilterSpec()).messages]
    alpha = [b for b in bodies if b.startswith(b"alpha")]
    assert alpha == [f"alpha-{i}".encode() for i in range(20)]
    assert queue_for_group("alpha", 8) == queue_for_group("alpha", 8)  # stable, not hash()


def test_past_delivery_time_goes_straight_to_the_queue(broker: Broker, clock: FakeClock) -> None:
    broker.create_topic("d", MessageType.DELAY, queue_count=1)
    result = broker.send(
        [out("d", message_type=MessageType.DELAY, delivery_timestamp=clock.now_ms())]
    )[0]
    assert result.queue_offset == 0
    view = broker.pull("c", "d", 0, 0, 1, FilterSpec()).messages[0]
    assert view.delivery_timestamp == clock.now_ms() and view.message_type is MessageType.DELAY


def test_body_digest_verification() -> None:
    body = b"hello"
    verify_body_digest(body, "CRC32", format(zlib.crc32(body), "X"))
    verify_body_digest(body, "MD5", hashlib.md5(body).hexdigest().upper())
    verify_body_digest(body, "SHA1", hashlib.sha1(body).hexdigest())
    with pytest.raises(BodyDigestMismatch) as info:
        verify_body_digest(body, "MD5", hashlib.md5(b"other").hexdigest())
    assert info.value.code == "MESSAGE_CORRUPTED"


def test_a_batch_wakes_each_grown_queue_once(broker: Broker) -> None:
    """One arrival per queue that grew in an append, not one per message: a proxy's request of
    a hundred sends must not call every watcher a hundred times."""
    broker.create_topic("t", queue_count=3)
    broker.create_topic("u", queue_count=1)
    woken: list[tuple[str, int]] = []
    broker.add_arrival_listener(lambda topic, queue_id: woken.append((topic, queue_id)))
    broker.send([out() for _ in range(12)] + [out("u") for _ in range(5)])
    assert sorted(woken) == [("t", 0), ("t", 1), ("t", 2), ("u", 0)]
    woken.clear()
    broker.send([out("u")])
    assert woken == [("u", 0)]


def test_a_message_sent_without_an_id_gets_a_new_one_in_its_record(
    broker: Broker, store: MemoryStore
) -> None:
    broker.create_topic("t", queue_count=1)
    first, second = broker.send([out(), out()])
    assert first.message_id != second.message_id
    assert store.read_at(first.commit_log_offset).unique_id == first.message_id
    assert store.read_at(second.commit_log_offset).unique_id == second.message_id
