"""The official RocketMQ 5 Python client (rocketmq-python-client), unchanged, against halfmoon.

The module runs twice: against one ``halfmoon serve`` process (local mode),
and through a ``halfmoon proxy`` in front of a ``halfmoon broker`` process
(the internal protocol). Each test uses its own topic and group names.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.v5.exception import BadRequestException, NotFoundException

from tests.cluster.cluster_server import ClusterServer
from tests.cluster.proxied_server import ProxiedServer
from tests.server.conftest import ServerProcess, unique, wait_until

pytestmark = pytest.mark.slow


def config(server: ServerProcess) -> ClientConfiguration:
    return ClientConfiguration(server.grpc, Credentials(), request_timeout=5)


def message(topic: str, body: str, **fields: object) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body.encode()
    for name, value in fields.items():
        if name == "properties":
            for k, v in value.items():  # type: ignore[attr-defined]
                msg.add_property(k, v)
        else:
            setattr(msg, name, value)
    return msg


def receive_all(
    consumer: SimpleConsumer, count: int, timeout: float, invisible: int = 15, ack: bool = True
) -> list[Message]:
    """Receive until ``count`` messages arrived (acking each unless told not to)."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for msg in consumer.receive(32, invisible):
            got.append(msg)
            if ack:
                consumer.ack(msg)
    return got


@pytest.fixture(scope="module", params=["local", "proxy", "cluster"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """``halfmoon serve``, or a proxy and a broker process: the same scenarios through both."""
    kind = {"local": ServerProcess, "proxy": ProxiedServer, "cluster": ClusterServer}[request.param]
    proc = kind(tmp_path_factory.mktemp(f"halfmoon-{request.param}")).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


@pytest.fixture(scope="module")
def producer(server: ServerProcess):
    p = Producer(config(server))
    p.startup()
    yield p
    p.shutdown()


def simple_consumer(
    server: ServerProcess,
    group: str,
    topic: str,
    expression: FilterExpression | None = None,
    await_duration: int = 2,
) -> SimpleConsumer:
    consumer = SimpleConsumer(
        config(server),
        group,
        {topic: expression or FilterExpression()},
        await_duration=await_duration,
    )
    consumer.startup()
    return consumer


def test_sync_and_async_send_then_simple_consumer_receives_acks_and_is_done(
    server: ServerProcess, producer: Producer
) -> None:
    topic, group = unique("normal"), unique("g")
    server.create_topic(topic, "normal", queues=4)
    server.create_group(group)
    sent = {}
    for i in range(5):
        receipt = producer.send(
            message(topic, f"sync-{i}", tag="TagA", keys=f"key-{i}", properties={"n": str(i)})
        )
        sent[receipt.message_id] = f"sync-{i}"
    futures = [producer.send_async(message(topic, f"async-{i}")) for i in range(5)]
    for i, future in enumerate(futures):
        sent[future.result(timeout=10).message_id] = f"async-{i}"
    assert len(sent) == 10

    consumer = simple_consumer(server, group, topic)
    try:
        got = receive_all(consumer, 10, timeout=15)
        assert {m.message_id: m.body.decode() for m in got} == sent
        first = next(m for m in got if m.body == b"sync-0")
        assert first.tag == "TagA" and first.keys == {"key-0"} and first.properties == {"n": "0"}
        assert all(m.delivery_attempt == 1 and m.topic == topic and not m.corrupted for m in got)
        # Everything was acknowledged: nothing comes back.
        assert consumer.receive(32, 15) == []
    finally:
        consumer.shutdown()


def test_tag_filter_delivers_only_matching_messages(
    server: ServerProcess, producer: Producer
) -> None:
    topic, group = unique("tags"), unique("g")
    server.create_topic(topic, "normal", queues=2)
    server.create_group(group)
    for i in range(6):
        producer.send(message(topic, f"m{i}", tag="A" if i % 2 == 0 else "B"))
    consumer = simple_consumer(server, group, topic, FilterExpression("A"))
    try:
        got = receive_all(consumer, 3, timeout=10)
        assert sorted(m.body for m in got) == [b"m0", b"m2", b"m4"]
        assert consumer.receive(32, 15) == []
    finally:
        consumer.shutdown()


def test_fifo_keeps_order_within_each_message_group(
    server: ServerProcess, producer: Producer
) -> None:
    topic, group = unique("fifo"), unique("gfifo")
    server.create_topic(topic, "fifo", queues=4)
    server.create_group(group, fifo=True)
    expected: dict[str, list[str]] = {g: [] for g in ("order-1", "order-2", "order-3")}
    for i in range(6):
        for g in expected:
            body = f"{g}:{i}"
            producer.send(message(topic, body, message_group=g))
            expected[g].append(body)

    consumer = simple_consumer(server, group, topic)
    try:
        got = receive_all(consumer, 18, timeout=20)
        seen: dict[str, list[str]] = {g: [] for g in expected}
        for m in got:
            assert m.message_group in expected
            # As on RocketMQ, the message group is also the __SHARDINGKEY user property.
            assert m.properties == {"__SHARDINGKEY": m.message_group}, m.properties
            seen[m.message_group].append(m.body.decode())
        assert seen == expected
    finally:
        consumer.shutdown()


def test_delay_message_arrives_at_its_time_not_before(
    server: ServerProcess, producer: Producer
) -> None:
    topic, group = unique("delay"), unique("g")
    server.create_topic(topic, "delay", queues=2)
    server.create_group(group)
    consumer = simple_consumer(server, group, topic, await_duration=5)
    try:
        # The Python client sends whole seconds.
        deliver_at_s = int(time.time()) + 3
        producer.send(message(topic, "later", delivery_timestamp=deliver_at_s))
        got = receive_all(consumer, 1, timeout=15)
        received_ms = time.time() * 1000
        assert [m.body for m in got] == [b"later"]
        assert received_ms >= deliver_at_s * 1000 - 50, "delivered before its time"
        assert received_ms <= deliver_at_s * 1000 + 1500, "delivered more than 1.5 s late"
        assert got[0].delivery_timestamp == deliver_at_s * 1000
    finally:
        consumer.shutdown()


def test_change_invisible_duration_redelivers_sooner_and_kills_the_old_handle(
    server: ServerProcess, producer: Producer
) -> None:
    topic, group = unique("invis"), unique("g")
    server.create_topic(topic, "normal", queues=1)
    server.create_group(group)
    producer.send(message(topic, "again"))
    consumer = simple_consumer(server, group, topic)
    try:
        [first] = receive_all(consumer, 1, timeout=10, invisible=30, ack=False)
        old_handle = first.receipt_handle
        changed_at = time.monotonic()
        consumer.change_invisible_duration(first, 1)
        assert first.receipt_handle != old_handle
        [second] = receive_all(consumer, 1, timeout=10, invisible=30, ack=False)
        assert time.monotonic() - changed_at >= 0.9
        assert second.message_id == first.message_id and second.delivery_attempt == 2
        stale = message(topic, "x")
        stale.receipt_handle = old_handle
        stale.message_id = first.message_id
        stale.endpoints = second.endpoints
        with pytest.raises(BadRequestException):
            consumer.ack(stale)
        consumer.ack(second)
        assert consumer.receive(32, 15) == []
    finally:
        consumer.shutdown()


class RecordingListener(MessageListener):
    def __init__(self, result: ConsumeResult) -> None:
        self.result = result
        self.deliveries: list[tuple[str, int, float]] = []
        self.lock = threading.Lock()

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.deliveries.append(
                (message.body.decode(), message.delivery_attempt, time.monotonic())
            )
        return self.result


def test_push_consumer_consumes_and_acks(server: ServerProcess, producer: Producer) -> None:
    topic, group = unique("push"), unique("gpush")
    server.create_topic(topic, "normal", queues=2)
    server.create_group(group)
    listener = RecordingListener(ConsumeResult.SUCCESS)
    consumer = PushConsumer(config(server), group, listener, {topic: FilterExpression()})
    consumer.startup()
    try:
        bodies = {f"p{i}" for i in range(8)}
        for body in sorted(bodies):
            producer.send(message(topic, body))
        wait_until(lambda: {d[0] for d in listener.deliveries} >= bodies, 20, "push deliveries")

        def settled() -> bool:
            _, progress = server.admin_call("GET", f"/v1/groups/{group}/progress")
            queues = progress["queues"]  # type: ignore[index]
            return sum(q["lag"] for q in queues) == 0 and sum(q["inflight"] for q in queues) == 0

        wait_until(settled, 10, "every push delivery acknowledged")
        assert sorted(d[0] for d in listener.deliveries) == sorted(bodies)
    finally:
        consumer.shutdown()


def test_push_consumer_failure_is_retried_then_dead_lettered(
    server: ServerProcess, producer: Producer
) -> None:
    topic, group = unique("retry"), unique("gretry")
    server.create_topic(topic, "normal", queues=1)
    server.create_group(
        group, max_delivery_attempts=2, retry_policy={"kind": "customized", "levels_ms": [1000]}
    )
    listener = RecordingListener(ConsumeResult.FAILURE)
    consumer = PushConsumer(config(server), group, listener, {topic: FilterExpression()})
    consumer.startup()
    dlq_reader = None
    try:
        receipt = producer.send(message(topic, "poison", properties={"why": "always fails"}))
        wait_until(lambda: len(listener.deliveries) >= 2, 20, "a retry of the failed message")
        attempts = [d[1] for d in listener.deliveries]
        assert attempts[:2] == [1, 2]
        assert listener.deliveries[1][2] - listener.deliveries[0][2] >= 0.9, (
            "retried before its backoff"
        )

        dead_letter_topic = f"%DLQ%{group}"
        wait_until(
            lambda: server.admin_call("GET", f"/v1/topics/{dead_letter_topic}")[0] == 200,
            15,
            "the dead-letter topic",
        )
        reader_group = unique("gdlq")
        server.create_group(reader_group)
        dlq_reader = simple_consumer(server, reader_group, dead_letter_topic)
        [dead] = receive_all(dlq_reader, 1, timeout=15)
        assert dead.message_id == receipt.message_id
        assert dead.body == b"poison" and dead.properties.get("why") == "always fails"
        assert len(listener.deliveries) == 2, "delivered again after max attempts"
    finally:
        consumer.shutdown()
        if dlq_reader is not None:
            dlq_reader.shutdown()


def test_fifo_push_consumer_sees_each_group_in_order(
    server: ServerProcess, producer: Producer
) -> None:
    topic, group = unique("fifopush"), unique("gfifopush")
    server.create_topic(topic, "fifo", queues=2)
    server.create_group(group, fifo=True)
    listener = RecordingListener(ConsumeResult.SUCCESS)
    consumer = PushConsumer(config(server), group, listener, {topic: FilterExpression()})
    consumer.startup()
    try:
        assert consumer.fifo, "the server's settings did not turn on FIFO consumption"
        expected = {g: [f"{g}:{i}" for i in range(5)] for g in ("a", "b")}
        for i in range(5):
            for g in expected:
                producer.send(message(topic, f"{g}:{i}", message_group=g))
        wait_until(lambda: len(listener.deliveries) >= 10, 20, "FIFO push deliveries")
        seen: dict[str, list[str]] = {g: [] for g in expected}
        for body, _, _ in listener.deliveries:
            seen[body.split(":")[0]].append(body)
        assert seen == expected
    finally:
        consumer.shutdown()


def test_consumer_started_after_the_producer_gets_what_was_already_sent(
    server: ServerProcess, producer: Producer
) -> None:
    """The quick-start order: send, then start a consumer of a group nobody created.

    RocketMQ 5 starts a new pop group at the queue's first message while it is
    hot; halfmoon used to start it at the end and silently skip these.
    """
    topic, group = unique("late-consumer"), unique("g-late")
    server.create_topic(topic, "normal", queues=4)
    sent = {producer.send(message(topic, f"early-{i}")).message_id for i in range(8)}
    consumer = simple_consumer(server, group, topic)
    try:
        got = receive_all(consumer, 8, timeout=15)
        assert {m.message_id for m in got} == sent
        assert consumer.receive(32, 15) == []
    finally:
        consumer.shutdown()


def test_send_receipt_transaction_id_is_the_message_id(
    server: ServerProcess, producer: Producer
) -> None:
    topic = unique("txid")
    server.create_topic(topic, "normal", queues=1)
    receipt = producer.send(message(topic, "plain"))
    # RocketMQ's broker answers every send with a transaction id: the message id.
    assert receipt.transaction_id == receipt.message_id


class CommitChecker(TransactionChecker):
    def check(self, message: Message) -> TransactionResolution:
        return TransactionResolution.COMMIT


def test_committed_transactional_message_carries_its_transaction_id(
    server: ServerProcess,
) -> None:
    topic, group = unique("txn"), unique("g")
    server.create_topic(topic, "transaction", queues=2)
    server.create_group(group)
    producer = Producer(config(server), topics=(topic,), checker=CommitChecker())
    producer.startup()
    consumer = None
    try:
        transaction = producer.begin_transaction()
        receipt = producer.send(message(topic, "committed", properties={"k": "v"}), transaction)
        transaction.commit()
        assert receipt.transaction_id
        consumer = simple_consumer(server, group, topic)
        [got] = receive_all(consumer, 1, timeout=15)
        assert got.message_id == receipt.message_id
        # As RocketMQ's broker: the transaction id the producer got, as a user property.
        assert got.properties == {"k": "v", "__transactionId__": receipt.transaction_id}
    finally:
        producer.shutdown()
        if consumer is not None:
            consumer.shutdown()


def test_unknown_topic_error_carries_rocketmqs_wording(
    server: ServerProcess, producer: Producer, caplog: pytest.LogCaptureFixture
) -> None:
    # The client turns the failed route query into its own exception and logs the
    # server's answer (code and message), which is where a user sees the wording.
    with caplog.at_level(logging.ERROR), pytest.raises(Exception, match="py-no-such-topic"):
        producer.send(message("py-no-such-topic", "nowhere"))
    text = caplog.text
    assert "40402" in text and "topic 'py-no-such-topic' does not exist" in text, text
    assert (
        "CODE: 17  DESC: No topic route info in name server for the topic: py-no-such-topic" in text
    ), text


def test_unknown_group_error_carries_rocketmqs_wording(server_factory: Any) -> None:
    srv = server_factory(settings=("broker.auto_create_groups=false",)).start()
    topic, group = unique("nogroup"), unique("never-created")
    srv.create_topic(topic, "normal", queues=1)
    consumer = SimpleConsumer(config(srv), group, {topic: FilterExpression()}, await_duration=1)
    try:
        with pytest.raises(NotFoundException) as raised:
            consumer.startup()
            consumer.receive(1, 15)
        text = str(raised.value)
        # apache.rocketmq.v2.Code.CONSUMER_GROUP_NOT_FOUND = 40403
        assert raised.value.code == 40403, text
        assert f"consumer group '{group}' does not exist" in text, text
        assert f"subscription group [{group}] does not exist" in text, text
    finally:
        with contextlib.suppress(Exception):
            consumer.shutdown()


def assigned_queue_ids(consumer: PushConsumer) -> set[int]:
    """The queues the consumer receives from (one process queue per assignment).

    The client keeps them private; a test may look, to know both consumers are
    receiving before anything is sent.
    """
    queues = consumer._PushConsumer__process_queues.keys()  # type: ignore[attr-defined]
    return {mq.message_queue0().id for mq in queues}


def test_two_fifo_push_consumers_share_the_queues_and_keep_each_groups_order(
    server: ServerProcess, producer: Producer
) -> None:
    topic, group = unique("fifoshare"), unique("gfifoshare")
    server.create_topic(topic, "fifo", queues=4)
    server.create_group(group, fifo=True)
    order: list[tuple[int, str]] = []  # (consumer, body), in the order consumption began
    order_lock = threading.Lock()

    class Tracking(RecordingListener):
        def __init__(self, index: int) -> None:
            super().__init__(ConsumeResult.SUCCESS)
            self.index = index

        def consume(self, message: Message) -> ConsumeResult:
            with order_lock:
                order.append((self.index, message.body.decode()))
            return super().consume(message)

    listeners = [Tracking(0), Tracking(1)]
    consumers = [
        PushConsumer(config(server), group, listener, {topic: FilterExpression()})
        for listener in listeners
    ]
    try:
        for consumer in consumers:
            consumer.startup()
        # Each consumer is assigned every queue of the FIFO topic, as on RocketMQ.
        wait_until(
            lambda: all(assigned_queue_ids(c) == {0, 1, 2, 3} for c in consumers),
            20,
            "both consumers receiving from the 4 queues",
        )
        message_groups = [f"order-{g}" for g in range(8)]
        expected = {g: [f"{g}:{i}" for i in range(6)] for g in message_groups}
        for i in range(6):
            for g in message_groups:
                producer.send(message(topic, f"{g}:{i}", message_group=g))
        total = sum(len(v) for v in expected.values())
        wait_until(lambda: len(order) >= total, 30, "every FIFO message consumed")

        bodies = [body for _, body in order]
        assert len(bodies) == len(set(bodies)) == total, "a message was consumed twice"
        seen: dict[str, list[str]] = {g: [] for g in message_groups}
        for body in bodies:
            seen[body.split(":")[0]].append(body)
        assert seen == expected, "a message group's order was broken"
        per_consumer = [sum(1 for index, _ in order if index == c) for c in (0, 1)]
        assert all(per_consumer), f"one consumer got nothing: {per_consumer}"

        def settled() -> bool:
            _, progress = server.admin_call("GET", f"/v1/groups/{group}/progress")
            queues = progress["queues"]  # type: ignore[index]
            return sum(q["lag"] for q in queues) == 0 and sum(q["inflight"] for q in queues) == 0

        wait_until(settled, 10, "every delivery acknowledged")
        assert len(order) == total, "delivered again after being acknowledged"
    finally:
        for consumer in consumers:
            consumer.shutdown()
