"""Consumption work the server does on its own, seen by the official clients.

* Dead letters do not wait for a consumer: a last delivery whose invisible
  time ends moves to ``%DLQ%<group>`` from the broker's tick (revive scan).
* Push consumers (``auto_renew``) have their invisible time renewed while
  their listener works, so a slow listener gets each message once.

The server runs with short invisible times so that this takes seconds:
auto-renewed receives are hidden 2 s, renewed 1 s ahead, by 2 s each time.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from rocketmq import ConsumeResult, FilterExpression, Message, MessageListener, PushConsumer

from tests.server.conftest import ServerProcess, wait_until
from tests.server.test_official_node_client import node, scripts  # noqa: F401 - fixtures
from tests.server.test_official_python_client import (
    config,
    message,
    simple_consumer,
    unique,
)

pytestmark = pytest.mark.slow

SETTINGS = (
    "broker.min_receive_invisible_ms=1s",
    "broker.default_invisible_ms=2s",  # also without renewal, a receive hides 2 s
    "server.auto_renew_invisible_time=2s",
    "server.renew_ahead_time=1s",
    "server.renew_schedule_period=250ms",
    "server.renew_durations=2s",
)
LISTENER_SECONDS = 5.0  # more than twice the invisible time


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("halfmoon-data"), settings=SETTINGS).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


@pytest.fixture(scope="module")
def producer(server: ServerProcess) -> Iterator[Any]:
    from rocketmq import Producer

    p = Producer(config(server))
    p.startup()
    yield p
    p.shutdown()


def stored_count(server: ServerProcess, topic: str) -> int:
    code, status = server.admin_call("GET", f"/v1/topics/{topic}/status")
    if code != 200:
        return 0
    queues = status["queues"] if isinstance(status, dict) else status  # type: ignore[index]
    return sum(q["max_offset"] - q["min_offset"] for q in queues)


def settled(server: ServerProcess, group: str) -> bool:
    _, progress = server.admin_call("GET", f"/v1/groups/{group}/progress")
    queues = progress["queues"]  # type: ignore[index]
    return bool(queues) and all(q["lag"] == 0 and q["inflight"] == 0 for q in queues)


def test_last_delivery_is_dead_lettered_after_its_consumer_stopped(
    server: ServerProcess, producer: Any
) -> None:
    topic, group = unique("revive"), unique("grevive")
    server.create_topic(topic, "normal", queues=1)
    server.create_group(group, max_delivery_attempts=1)
    receipt = producer.send(message(topic, "poison"))
    consumer = simple_consumer(server, group, topic)
    try:
        deadline = time.monotonic() + 15
        got: list[Message] = []
        while not got and time.monotonic() < deadline:
            got = consumer.receive(1, 2)  # its last attempt, hidden for 2 s, never acked
        assert [m.message_id for m in got] == [receipt.message_id]
        received_at = time.monotonic()
    finally:
        consumer.shutdown()  # nobody of the group receives again
    dead_letter_topic = f"%DLQ%{group}"
    wait_until(lambda: stored_count(server, dead_letter_topic) == 1, 10, "the dead letter")
    assert time.monotonic() - received_at >= 1.9, "dead-lettered before its invisible time ended"
    reader_group = unique("gdlq")
    server.create_group(reader_group)  # from the earliest message
    reader = simple_consumer(server, reader_group, dead_letter_topic)
    try:
        deadline = time.monotonic() + 10
        dead: list[Message] = []
        while not dead and time.monotonic() < deadline:
            dead = reader.receive(1, 10)
        assert [(m.message_id, m.body) for m in dead] == [(receipt.message_id, b"poison")]
    finally:
        reader.shutdown()
    assert settled(server, group)


class SlowListener(MessageListener):
    def __init__(self, seconds: float, result: ConsumeResult = ConsumeResult.SUCCESS) -> None:
        self.seconds = seconds
        self.result = result
        self.started: list[float] = []
        self.deliveries: list[tuple[str, int]] = []
        self.finished: list[str] = []
        self.lock = threading.Lock()

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.deliveries.append((message.body.decode(), message.delivery_attempt))
            self.started.append(time.monotonic())
        time.sleep(self.seconds)  # the listener's work, longer than the invisible time
        with self.lock:
            self.finished.append(message.body.decode())
        return self.result


def test_python_push_consumer_slower_than_the_invisible_time_gets_each_message_once(
    server: ServerProcess, producer: Any
) -> None:
    topic, group = unique("renew"), unique("grenew")
    server.create_topic(topic, "normal", queues=2)
    server.create_group(group)
    bodies = [f"slow{i}" for i in range(3)]
    for body in bodies:
        producer.send(message(topic, body))
    listener = SlowListener(LISTENER_SECONDS)
    consumer = PushConsumer(config(server), group, listener, {topic: FilterExpression()})
    consumer.startup()
    try:
        wait_until(lambda: len(listener.finished) >= len(bodies), 30, "the slow listener")
        # Acked with the original handles after several renewals: nothing left in flight.
        wait_until(lambda: settled(server, group), 10, "every message acknowledged")
        assert Counter(b for b, _ in listener.deliveries) == Counter(bodies)
        assert {attempt for _, attempt in listener.deliveries} == {1}
    finally:
        consumer.shutdown()


@pytest.mark.parametrize("fifo", [False, True], ids=["nack", "fifo-forward"])
def test_slow_failures_are_retried_then_dead_lettered_with_the_original_handles(
    server: ServerProcess, producer: Any, fifo: bool
) -> None:
    """A slow listener fails twice; the client nacks (or, FIFO, forwards to the DLQ) with
    the handle it received, several renewals old."""
    topic, group = unique("renewfail"), unique("grenewfail")
    server.create_topic(topic, "fifo" if fifo else "normal", queues=1)
    server.create_group(
        group,
        fifo=fifo,
        max_delivery_attempts=2,
        retry_policy={"kind": "customized", "levels_ms": [1000]},
    )
    fields = {"message_group": "mg"} if fifo else {}
    receipt = producer.send(message(topic, "always-fails", **fields))
    listener = SlowListener(3.0, ConsumeResult.FAILURE)
    consumer = PushConsumer(config(server), group, listener, {topic: FilterExpression()})
    consumer.startup()
    try:
        dead_letter_topic = f"%DLQ%{group}"
        wait_until(lambda: stored_count(server, dead_letter_topic) == 1, 30, "the dead letter")
        wait_until(lambda: settled(server, group), 10, "nothing left in flight")
        # A FIFO push consumer retries locally, with the same delivery (attempt 1).
        assert [attempt for _, attempt in listener.deliveries] == ([1, 1] if fifo else [1, 2])
        first, second = listener.started
        assert second - first >= 3.9, "redelivered while the listener still worked on it"
    finally:
        consumer.shutdown()
    reader_group = unique("gdlq")
    server.create_group(reader_group)
    reader = simple_consumer(server, reader_group, dead_letter_topic)
    try:
        deadline = time.monotonic() + 10
        dead: list[Message] = []
        while not dead and time.monotonic() < deadline:
            dead = reader.receive(1, 10)
        assert [m.message_id for m in dead] == [receipt.message_id]
    finally:
        reader.shutdown()


def test_node_push_consumer_slower_than_the_invisible_time_gets_each_message_once(
    server: ServerProcess,
    producer: Any,
    scripts: Any,  # noqa: F811 - the fixture imported above
) -> None:
    topic, group = unique("renewnode"), unique("grenewnode")
    server.create_topic(topic, "normal", queues=2)
    server.create_group(group)
    bodies = [f"node-slow{i}" for i in range(3)]
    for body in bodies:
        producer.send(message(topic, body))
    run = scripts(
        "push_slow_consume.js",
        {
            "endpoints": server.grpc,
            "group": group,
            "topic": topic,
            "expect": len(bodies),
            "listenerMs": int(LISTENER_SECONDS * 1000),
            "lingerMs": 1500,
            "deadlineMs": 40_000,
        },
    ).finish(60)
    assert run.returncode == 0, run.explain()
    received = run.events("received")
    assert Counter(r["body"] for r in received) == Counter(bodies), run.explain()
    assert {r["deliveryAttempt"] for r in received} == {1}, run.explain()
    wait_until(lambda: settled(server, group), 10, "every message acknowledged")


def test_node_consumers_last_delivery_is_dead_lettered_after_it_stopped(
    server: ServerProcess,
    producer: Any,
    scripts: Any,  # noqa: F811 - the fixture imported above
) -> None:
    """The Node SimpleConsumer takes a message's last delivery, postpones it 6 s, and exits."""
    topic, group = unique("revivenode"), unique("grevivenode")
    server.create_topic(topic, "normal", queues=1)
    server.create_group(group, max_delivery_attempts=1)
    receipt = producer.send(message(topic, "node-poison", properties={"poison": "true"}))
    run = scripts(
        "simple_consume.js",
        {"endpoints": server.grpc, "group": group, "topic": topic, "expect": 1,
         "retryProperty": "poison", "retryInvisibleMs": 6000, "invisibleMs": 2000,
         "deadlineMs": 2500},
    ).finish(60)  # fmt: skip
    (record,) = run.events("received")
    assert record["messageId"] == receipt.message_id and record["action"] == "change_invisible"
    assert record["error"] is None, run.explain()
    assert run.returncode == 1  # never acknowledged; the consumer is gone now
    dead_letter_topic = f"%DLQ%{group}"
    wait_until(lambda: stored_count(server, dead_letter_topic) == 1, 20, "the dead letter")
    assert time.time() * 1000 - record["receivedAtMs"] >= 5_900, "dead-lettered too early"
    assert settled(server, group)
