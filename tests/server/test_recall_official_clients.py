"""Recalling delay messages with the official clients' RecallMessage, against a real server.

Each client sends two delay messages due at the same time, recalls one with the
recall handle of its SendReceipt, and a consumer then sees only the other.
Recalling after delivery fails with a clear error; a forged handle is refused.
Each scenario runs against ``halfmoon serve`` and against a cluster (etcd, two
brokers, two proxies: the recall handle names the broker holding the message).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)
from rocketmq.v5.exception import BadRequestException

from tests.server.conftest import ServerProcess, unique
from tests.server.test_official_node_client import (  # noqa: F401 - fixtures
    _check_consumer,
    _fail,
    node,
    scripts,
    server,
)

pytestmark = pytest.mark.slow

DELAY_S = 3


def _delay_message(topic: str, body: str, deliver_at_s: int) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body.encode()
    msg.delivery_timestamp = deliver_at_s  # the Python client sends whole seconds
    return msg


def test_python_client_recalls_a_delay_message_before_its_time(
    server: ServerProcess,  # noqa: F811 - fixture
) -> None:
    topic, group = unique("recall-py"), unique("g")
    server.create_topic(topic, "delay", queues=2)
    server.create_group(group)
    config = ClientConfiguration(server.grpc, Credentials(), request_timeout=5)
    producer = Producer(config)
    producer.startup()
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    try:
        deliver_at_s = int(time.time()) + DELAY_S
        kept = producer.send(_delay_message(topic, "kept", deliver_at_s))
        recalled = producer.send(_delay_message(topic, "recalled", deliver_at_s))
        assert kept.recall_handle and recalled.recall_handle
        assert producer.recall_message(topic, recalled.recall_handle) == recalled.message_id
        assert (
            producer.recall_message(topic, recalled.recall_handle) == recalled.message_id
        )  # idempotent

        got: list[Message] = []
        deadline = time.monotonic() + DELAY_S + 10
        while not got and time.monotonic() < deadline:
            got += consumer.receive(32, 15)
        # Both were due at the same moment: had the recalled one been delivered, it would
        # be visible now; one more long poll gives it every chance to show up.
        got += consumer.receive(32, 15)
        assert [m.body for m in got] == [b"kept"]
        assert got[0].message_id == kept.message_id
        assert time.time() >= deliver_at_s - 0.05
        for m in got:
            consumer.ack(m)

        with pytest.raises(Exception, match="already delivered") as too_late:
            producer.recall_message(topic, kept.recall_handle)
        assert not isinstance(too_late.value, BadRequestException)  # NOT_FOUND, not a bad request
        with pytest.raises(BadRequestException, match="recall handle"):
            producer.recall_message(topic, kept.recall_handle[:-4] + "AAAA")
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_node_client_recalls_a_delay_message_before_its_time(
    server: ServerProcess,  # noqa: F811 - fixture
    scripts: Any,  # noqa: F811 - fixture
) -> None:
    topic, group = unique("recall-node"), unique("g")
    server.create_topic(topic, "delay", queues=2)
    server.create_group(group)
    delay_ms = DELAY_S * 1000
    consumer = scripts(
        "simple_consume.js",
        {
            "endpoints": server.grpc,
            "topic": topic,
            "group": group,
            "expect": 1,
            "lingerMs": 1500,
            "deadlineMs": 20000,
        },
    )
    producer = scripts(
        "recall.js",
        {
            "endpoints": server.grpc,
            "topic": topic,
            "messages": [
                {"body": "kept", "delayMs": delay_ms, "recall": False},
                {"body": "recalled", "delayMs": delay_ms, "recall": True, "recallTwice": True},
            ],
            "forgedHandle": "garbage",
        },
    ).finish()
    assert producer.returncode == 0, _fail("recall.js failed", producer, server=server)
    sent = producer.events("sent")
    assert len(sent) == 2 and all(r["recallHandle"] for r in sent), _fail(
        "no recall handles", producer
    )
    recalls = producer.events("recalled")
    assert [(r["index"], r["messageId"]) for r in recalls] == [(1, sent[1]["messageId"])] * 2, (
        _fail("recall did not answer with the message id", producer)
    )
    errors = producer.events("recall_error")
    assert [e["index"] for e in errors] == ["forged"], _fail("unexpected recall errors", producer)
    assert "recall handle" in errors[0]["error"], errors

    run = consumer.finish()
    received = _check_consumer(run, "recall consumer", server)
    assert [r["messageId"] for r in received] == [sent[0]["messageId"]], _fail(
        "the recalled message was delivered (or the kept one was not)", run, producer
    )
    assert received[0]["receivedAtMs"] >= sent[0]["deliveryTimestampMs"] - 5
