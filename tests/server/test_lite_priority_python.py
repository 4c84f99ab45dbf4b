"""Priority and lite topics through the official Python client (5.1.2), against ``halfmoon serve``.

- A producer sends priority messages; a consumer draining the backlog sees
  RocketMQ's order: highest priority first, send order within a priority.
- A producer sends lite messages; LiteSimpleConsumer and LitePushConsumer
  subscribe to lite topics and get those lite topics' messages only.
"""

from __future__ import annotations

import threading
import time

import pytest
from rocketmq import ConsumeResult, Message, MessageListener, Producer
from rocketmq.v5.consumer import LitePushConsumer, LiteSimpleConsumer
from rocketmq.v5.exception import IllegalStateException

from tests.server.conftest import ServerProcess, wait_until
from tests.server.test_official_python_client import config, message, simple_consumer, unique

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def producer(server: ServerProcess):
    p = Producer(config(server))
    p.startup()
    yield p
    p.shutdown()


def test_priority_backlog_is_consumed_highest_priority_first(
    server: ServerProcess, producer: Producer
) -> None:
    topic, group = unique("prio"), unique("gprio")
    server.create_topic(topic, "priority", queues=4)
    server.create_group(group)
    priorities = [0, 2, 1, 3, 0, 9, 2, 1]  # 9: beyond the last queue, so queue 3
    for i, priority in enumerate(priorities):
        receipt = producer.send(message(topic, f"{priority}-{i}", priority=priority))
        assert receipt.message_id
    consumer = simple_consumer(server, group, topic)
    try:
        got: list[Message] = []
        deadline = time.monotonic() + 20
        while len(got) < len(priorities) and time.monotonic() < deadline:
            for msg in consumer.receive(1, 15):  # one at a time: each pick is the broker's
                got.append(msg)
                consumer.ack(msg)
        bodies = [m.body.decode() for m in got]
        assert bodies == ["3-3", "9-5", "2-1", "2-6", "1-2", "1-7", "0-0", "0-4"]
        assert [m.priority for m in got] == [3, 9, 2, 2, 1, 1, 0, 0]
        assert {m.message_type for m in got} == {6}  # PRIORITY
        assert consumer.receive(1, 15) == []
    finally:
        consumer.shutdown()


def test_priority_message_to_a_normal_topic_is_refused(
    server: ServerProcess, producer: Producer
) -> None:
    topic = unique("plain")
    server.create_topic(topic, "normal", queues=2)
    with pytest.raises(Exception, match="(?i)message type"):
        producer.send(message(topic, "x", priority=1))


def lite_message(topic: str, lite_topic: str, body: str) -> Message:
    return message(topic, body, lite_topic=lite_topic)


def subscribe(consumer: LiteSimpleConsumer | LitePushConsumer, lite_topic: str) -> None:
    """subscribe_lite, then the full set again (what the client itself does every 30 s).

    rocketmq-python-client 5.1.2 sends subscribe_lite's name as ``lite_topic_set.extend(name)``:
    one lite topic per *character* ("s1" subscribes "s" and "1"), on Apache RocketMQ as on
    halfmoon. Its periodic COMPLETE_ADD carries the right set; subscribe_lite_all sends that
    now instead of 30 s later.
    """
    consumer.subscribe_lite(lite_topic)
    consumer.subscribe_lite_all()


def manager_of(consumer: object) -> object:
    for name in (
        "_LiteSimpleConsumer__subscription_manager",
        "_LitePushConsumer__subscription_manager",
    ):
        if hasattr(consumer, name):
            return getattr(consumer, name)
    raise AssertionError("no lite subscription manager")


def test_lite_simple_consumer_gets_its_lite_topics_only(
    server: ServerProcess, producer: Producer
) -> None:
    topic, group = unique("chat"), unique("glite")
    server.create_topic(topic, "lite", queues=1)
    server.create_group(group)
    consumer = LiteSimpleConsumer(topic, config(server), group, await_duration=2)
    consumer.startup()
    try:
        manager = manager_of(consumer)
        # The quota arrives with the settings answer; the client refuses any name before.
        wait_until(lambda: manager.lite_subscription_quota == 1000, 10, "lite settings")  # type: ignore[attr-defined]
        assert manager.max_lite_topic_size == 64  # type: ignore[attr-defined]
        subscribe(consumer, "session-1")
        for i in range(3):
            producer.send(lite_message(topic, "session-1", f"one-{i}"))
            producer.send(lite_message(topic, "session-2", f"two-{i}"))
        got: list[Message] = []
        deadline = time.monotonic() + 20
        while len(got) < 3 and time.monotonic() < deadline:
            for msg in consumer.receive(16, 15):
                got.append(msg)
                consumer.ack(msg)
        assert [m.body for m in got] == [b"one-0", b"one-1", b"one-2"]  # in order
        assert {(m.lite_topic, m.topic, m.message_type) for m in got} == {("session-1", topic, 5)}
        assert consumer.receive(16, 15) == []

        subscribe(consumer, "session-2")
        later = []
        deadline = time.monotonic() + 20
        while len(later) < 3 and time.monotonic() < deadline:
            for msg in consumer.receive(16, 15):
                later.append(msg)
                consumer.ack(msg)
        assert [m.body for m in later] == [b"two-0", b"two-1", b"two-2"]
        consumer.unsubscribe_lite("session-1")
        producer.send(lite_message(topic, "session-1", "after unsubscribe"))
        assert consumer.receive(16, 15) == []
        with pytest.raises(IllegalStateException):
            consumer.subscribe_lite("")  # the client's own check; the broker's is the same rule
    finally:
        consumer.shutdown()


class Recorder(MessageListener):
    def __init__(self) -> None:
        self.got: list[tuple[str, str | None, int]] = []
        self.lock = threading.Lock()

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.got.append((message.body.decode(), message.lite_topic, message.delivery_attempt))
        return ConsumeResult.SUCCESS


def test_lite_push_consumer_receives_subscribed_lite_topics(
    server: ServerProcess, producer: Producer
) -> None:
    topic, group = unique("chat"), unique("glitepush")
    server.create_topic(topic, "lite", queues=1)
    server.create_group(group)
    listener = Recorder()
    consumer = LitePushConsumer(config(server), group, topic, listener)
    consumer.startup()  # waits for settings: fails without the lite quota and name limit
    try:
        subscribe(consumer, "device-7")
        producer.send(lite_message(topic, "device-8", "not mine"))
        for i in range(4):
            producer.send(lite_message(topic, "device-7", f"d7-{i}"))
        wait_until(lambda: len(listener.got) >= 4, 20, "lite push deliveries")

        def settled() -> bool:
            _, answer = server.admin_call("GET", f"/v1/topics/{topic}/lite-topics")
            subs = answer["subscriptions"]  # type: ignore[index]
            return any("device-7" in s["lite_topics"] for s in subs)

        wait_until(settled, 10, "the subscription listed by the admin API")
        with listener.lock:
            assert sorted(listener.got) == [(f"d7-{i}", "device-7", 1) for i in range(4)]
    finally:
        consumer.shutdown()
