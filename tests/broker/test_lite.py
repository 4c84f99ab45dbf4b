"""Lite topics (RIP-83): one queue per lite topic, per-client subscriptions, quotas, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from halfmoon.broker import Broker, BrokerConfig, FakeClock
from halfmoon.broker.errors import IllegalTopic, MessageTypeMismatch, PermissionDenied
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.lite import OffsetOption
from halfmoon.broker.lite_names import (
    IllegalLiteTopic,
    LiteSubscriptionQuotaExceeded,
    LiteTopicQuotaExceeded,
    lite_queue_topic,
    split_lite_queue_topic,
)
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.broker.receipt import InvalidReceiptHandle
from halfmoon.errors import NotFound
from halfmoon.store.memory import MemoryStore

TOPIC = "chat"
GROUP = "bots"
CLIENT = "client-1"


def lite(name: str, body: bytes = b"x") -> OutgoingMessage:
    return OutgoingMessage(TOPIC, body, message_type=MessageType.LITE, lite_topic=name)


@pytest.fixture
def chat(broker: Broker) -> Broker:
    broker.create_topic(TOPIC, MessageType.LITE, queue_count=1)
    broker.create_group(GROUP)
    return broker


def receive(broker: Broker, client: str = CLIENT, batch: int = 16) -> list:
    return broker.receive(GROUP, TOPIC, FilterSpec(), batch, 30_000, client)


def sync(broker: Broker, action: str, *names: str, client: str = CLIENT, **kw: object) -> list:
    return broker.sync_lite_subscription(client, GROUP, TOPIC, action, list(names), **kw)


def test_queue_names_round_trip() -> None:
    assert split_lite_queue_topic(lite_queue_topic("chat", "s-1")) == ("chat", "s-1")
    assert split_lite_queue_topic(lite_queue_topic("a%b", "c")) == ("a%b", "c")
    assert split_lite_queue_topic("chat") is None


def test_each_lite_topic_is_its_own_queue(chat: Broker) -> None:
    results = chat.send([lite("s1", b"a"), lite("s2", b"b"), lite("s1", b"c")])
    assert [(r.topic, r.queue_id, r.queue_offset) for r in results] == [
        (TOPIC, 0, 0),
        (TOPIC, 0, 0),
        (TOPIC, 0, 1),
    ]
    assert [t["lite_topic"] for t in chat.list_lite_topics(TOPIC)] == ["s1", "s2"]


def test_receive_delivers_only_subscribed_lite_topics(chat: Broker) -> None:
    chat.send([lite("s1", b"one"), lite("s2", b"two")])
    assert receive(chat) == []  # nothing subscribed yet
    sync(chat, "partial_add", "s1")
    views = receive(chat)
    assert [(v.body, v.lite_topic, v.topic) for v in views] == [(b"one", "s1", TOPIC)]
    assert views[0].message_type is MessageType.LITE
    assert receive(chat, client="client-2") == []  # subscriptions are per client


def test_lite_topic_is_delivered_in_order_one_flight_at_a_time(chat: Broker) -> None:
    sync(chat, "partial_add", "s1")
    chat.send([lite("s1", b"1"), lite("s1", b"2")])
    first = receive(chat, batch=1)
    assert [v.body for v in first] == [b"1"]
    assert receive(chat) == []  # FIFO per lite topic: 2 waits for 1
    chat.ack(GROUP, TOPIC, first[0].receipt_handle, lite_topic="s1")
    assert [v.body for v in receive(chat)] == [b"2"]


def test_messages_sent_before_subscribing_are_delivered(chat: Broker) -> None:
    chat.send([lite("s1", b"early")])
    sync(chat, "partial_add", "s1")
    assert [v.body for v in receive(chat)] == [b"early"]


def test_offset_option_moves_the_group(chat: Broker) -> None:
    chat.send([lite("s1", b"a"), lite("s1", b"b"), lite("s1", b"c")])
    sync(chat, "partial_add", "s1", offset=OffsetOption("tail_n", 1))
    assert [v.body for v in receive(chat)] == [b"c"]


def test_partial_remove_and_complete_actions(chat: Broker) -> None:
    assert sync(chat, "partial_add", "a", "b") == ["a", "b"]
    assert sync(chat, "partial_remove", "a") == ["b"]
    assert sync(chat, "complete_add", "c", "d") == ["c", "d"]
    assert sync(chat, "complete_add") == []
    sync(chat, "partial_add", "e")
    assert sync(chat, "complete_remove") == []
    assert chat.lite.subscriptions(TOPIC) == []


def test_subscription_quota(store: MemoryStore, clock: FakeClock, tmp_path: Path) -> None:
    broker = Broker(store, tmp_path, BrokerConfig(lite_subscription_quota=2), clock)
    broker.create_topic(TOPIC, MessageType.LITE, queue_count=1)
    sync(broker, "partial_add", "a", "b")
    with pytest.raises(LiteSubscriptionQuotaExceeded) as caught:
        sync(broker, "partial_add", "c")
    assert caught.value.code == "LITE_SUBSCRIPTION_QUOTA_EXCEEDED"
    with pytest.raises(LiteSubscriptionQuotaExceeded):
        sync(broker, "complete_add", "a", "b", "c")
    assert sync(broker, "partial_add", "a") == ["a", "b"]  # already there: no new quota
    broker.close()


def test_lite_topic_quota(store: MemoryStore, clock: FakeClock, tmp_path: Path) -> None:
    broker = Broker(store, tmp_path, BrokerConfig(max_lite_topics_per_topic=2), clock)
    broker.create_topic(TOPIC, MessageType.LITE, queue_count=1)
    broker.send([lite("a"), lite("b"), lite("a")])
    with pytest.raises(LiteTopicQuotaExceeded) as caught:
        broker.send([lite("c")])
    assert caught.value.code == "LITE_TOPIC_QUOTA_EXCEEDED"
    broker.close()


@pytest.mark.parametrize("name", ["", "  ", "a b", "a%b", "x" * 65, "ü"])
def test_illegal_lite_topic_is_refused_everywhere_with_one_code(chat: Broker, name: str) -> None:
    attempts = [
        lambda: chat.send([lite(name)]),
        lambda: sync(chat, "partial_add", name),
        lambda: sync(chat, "partial_remove", name),
        lambda: sync(chat, "complete_add", "ok", name),
        lambda: chat.ack(GROUP, TOPIC, "handle", lite_topic=name),
        lambda: chat.change_invisible_duration(GROUP, TOPIC, "handle", 10_000, lite_topic=name),
        lambda: chat.forward_to_dead_letter(GROUP, TOPIC, "handle", lite_topic=name),
        lambda: chat.delete_lite_topic(TOPIC, name),
    ]
    for attempt in attempts:
        with pytest.raises(IllegalLiteTopic) as caught:
            attempt()
        assert caught.value.code == "ILLEGAL_LITE_TOPIC"


def test_ack_without_lite_topic_uses_the_handles_queue(chat: Broker) -> None:
    # halfmoon's renewal of auto_renew receives changes invisible times without it.
    sync(chat, "partial_add", "s1")
    chat.send([lite("s1", b"1"), lite("s1", b"2")])
    (first,) = receive(chat, batch=1)
    handle = chat.change_invisible_duration(GROUP, TOPIC, first.receipt_handle, 20_000)
    chat.ack(GROUP, TOPIC, handle)
    assert [v.body for v in receive(chat)] == [b"2"]
    with pytest.raises(InvalidReceiptHandle):
        chat.ack(GROUP, TOPIC, "garbled")


def test_types_must_match(chat: Broker) -> None:
    chat.create_topic("plain", MessageType.NORMAL, queue_count=1)
    with pytest.raises(MessageTypeMismatch):
        chat.send([OutgoingMessage("plain", b"x", message_type=MessageType.LITE, lite_topic="a")])
    with pytest.raises(MessageTypeMismatch):
        chat.send([OutgoingMessage(TOPIC, b"x", lite_topic="a")])
    with pytest.raises(IllegalTopic):
        chat.sync_lite_subscription(CLIENT, GROUP, "plain", "partial_add", ["a"])


def test_group_that_may_not_consume_cannot_subscribe(chat: Broker) -> None:
    chat.update_group(GROUP, consume_enabled=False)
    with pytest.raises(PermissionDenied):
        sync(chat, "partial_add", "a")


def test_delete_lite_topic_notifies_subscribers(chat: Broker) -> None:
    told: list[tuple[str, str, str, str]] = []
    chat.lite.set_notifier(lambda *args: told.append(args))
    chat.send([lite("s1"), lite("s2")])
    sync(chat, "partial_add", "s1", "s2")
    assert chat.delete_lite_topic(TOPIC, "s1") == 1
    assert told == [(CLIENT, GROUP, TOPIC, "s1")]
    assert [t["lite_topic"] for t in chat.list_lite_topics(TOPIC)] == ["s2"]
    assert chat.lite.subscriptions(TOPIC)[0]["lite_topics"] == ["s2"]
    with pytest.raises(NotFound):
        chat.delete_lite_topic(TOPIC, "s1")
    chat.delete_topic(TOPIC)
    assert told[-1] == (CLIENT, GROUP, TOPIC, "s2")


def test_subscriptions_lapse_without_sync(chat: Broker, clock: FakeClock) -> None:
    sync(chat, "partial_add", "s1")
    clock.advance(BrokerConfig().lite_subscription_timeout_ms + 1)
    chat.tick()
    assert chat.lite.subscriptions() == []


def test_arrivals_wake_waiters_on_the_parent_topic(chat: Broker) -> None:
    seen: list[tuple[str, int]] = []
    chat.add_arrival_listener(lambda topic, queue: seen.append((topic, queue)))
    chat.send([lite("s1")])
    assert seen == [(TOPIC, 0)]


def test_redelivery_and_consumption_survive_a_restart(
    store: MemoryStore, clock: FakeClock, tmp_path: Path
) -> None:
    broker = Broker(store, tmp_path, BrokerConfig(), clock)
    broker.create_topic(TOPIC, MessageType.LITE, queue_count=1)
    broker.send([lite("s1", b"a"), lite("s1", b"b")])
    sync(broker, "partial_add", "s1")
    (view,) = receive(broker, batch=1)
    broker.ack(GROUP, TOPIC, view.receipt_handle, lite_topic="s1")
    broker.close()
    again = Broker(store, tmp_path, BrokerConfig(), clock)
    sync(again, "partial_add", "s1")
    assert [v.body for v in receive(again)] == [b"b"]
    assert [t["lite_topic"] for t in again.list_lite_topics(TOPIC)] == ["s1"]
    again.close()
