"""Conformance: programs shaped like the official clients' shipped examples.

Each scenario is what a user copies from ``rocketmq-clients/python/example``
(normal, async, FIFO, delay, transaction with check-back, recall; simple and
push consumers) with only the endpoint and names changed, run against a real
``halfmoon serve`` through the official Python client, and again through a
``halfmoon proxy`` in front of a ``halfmoon broker`` process. The assertions are what
Apache RocketMQ 5 delivers to the same program. As in the examples, consumer
groups are not created beforehand (the broker creates them on first use) and
consumers start after their producer has sent: nothing sent may be skipped.

Topics are created through the admin API, as RocketMQ needs ``mqadmin
updateTopic`` before its examples run; a FIFO group is created with ``fifo``
as RocketMQ needs ``updateSubGroup -o true``.
"""

from __future__ import annotations

import collections
import threading
import time

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

from tests.cluster.cluster_server import ClusterServer
from tests.cluster.proxied_server import ProxiedServer
from tests.server.conftest import ServerProcess, unique, wait_until

pytestmark = pytest.mark.slow

SETTINGS = (
    # The check-back example waits for the server's check: make it come within the test.
    "transaction.timeout_ms=500ms",
    "transaction.check_interval_ms=250ms",
    "transaction.check_max=5",
)


@pytest.fixture(scope="module", params=["local", "proxy", "cluster"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """``halfmoon serve``, or a proxy and a broker process: the same programs through both."""
    kind = {"local": ServerProcess, "proxy": ProxiedServer, "cluster": ClusterServer}[request.param]
    proc = kind(tmp_path_factory.mktemp(f"conformance-{request.param}"), settings=SETTINGS).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


def config(server: ServerProcess) -> ClientConfiguration:
    return ClientConfiguration(server.grpc, Credentials())


def example_message(topic: str, body: str, **fields: object) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body.encode("utf-8")
    for name, value in fields.items():
        setattr(msg, name, value)
    return msg


def drain(consumer: SimpleConsumer, count: int, timeout: float) -> list[Message]:
    """simple_consumer_example's loop: receive(32, 15) and ack each, until ``count`` arrived."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for msg in consumer.receive(32, 15):
            consumer.ack(msg)
            got.append(msg)
    return got


class Recorder(MessageListener):
    """push_consumer_example's listener, recording what it consumed."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.lock = threading.Lock()

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.messages.append(message)
        return ConsumeResult.SUCCESS


def test_normal_and_async_producer_then_simple_consumer(server: ServerProcess) -> None:
    topic, group = unique("normal"), unique("consumer-group")
    server.create_topic(topic, "normal", queues=4)
    producer = Producer(config(server), (topic,))
    producer.startup()
    try:
        sent = {}
        for i in range(5):
            msg = example_message(topic, f"hello-{i}", tag="rocketmq-send-message", keys=f"k{i}")
            sent[producer.send(msg).message_id] = f"hello-{i}"
        futures = [producer.send_async(example_message(topic, f"async-{i}")) for i in range(5)]
        for i, future in enumerate(futures):
            sent[future.result(timeout=10).message_id] = f"async-{i}"
    finally:
        producer.shutdown()

    consumer = SimpleConsumer(config(server), group, {topic: FilterExpression()})
    consumer.startup()
    try:
        got = drain(consumer, len(sent), timeout=20)
        assert {m.message_id: m.body.decode() for m in got} == sent
        tagged = next(m for m in got if m.body == b"hello-0")
        assert tagged.tag == "rocketmq-send-message" and tagged.keys == {"k0"}
        assert consumer.receive(32, 15) == [], "acknowledged messages came back"
    finally:
        consumer.shutdown()


def test_fifo_producer_then_push_consumer_keeps_each_group_in_order(
    server: ServerProcess,
) -> None:
    topic, group = unique("fifo"), unique("fifo-group")
    server.create_topic(topic, "fifo", queues=4)
    code, answer = server.admin_call("POST", "/v1/groups", {"name": group, "fifo": True})
    assert code in (200, 201), answer
    producer = Producer(config(server), (topic,))
    producer.startup()
    expected: dict[str, list[str]] = collections.defaultdict(list)
    try:
        for i in range(8):
            for message_group in ("fifo-group-a", "fifo-group-b"):
                body = f"{message_group}:{i}"
                producer.send(example_message(topic, body, message_group=message_group))
                expected[message_group].append(body)
    finally:
        producer.shutdown()

    listener = Recorder()
    consumer = PushConsumer(config(server), group, listener, {topic: FilterExpression()})
    consumer.startup()
    try:
        wait_until(lambda: len(listener.messages) >= 16, 30, "every FIFO message consumed")
        seen: dict[str, list[str]] = collections.defaultdict(list)
        with listener.lock:
            for m in listener.messages:
                seen[m.message_group].append(m.body.decode())
        assert seen == expected
    finally:
        consumer.shutdown()


def test_delay_producer_then_consumer_gets_it_at_its_time(server: ServerProcess) -> None:
    topic, group = unique("delay"), unique("delay-group")
    server.create_topic(topic, "delay", queues=2)
    producer = Producer(config(server), (topic,))
    producer.startup()
    try:
        deliver_at_s = int(time.time()) + 3  # the example's delay, in whole seconds
        producer.send(example_message(topic, "delayed", delivery_timestamp=deliver_at_s))
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config(server), group, {topic: FilterExpression()})
    consumer.startup()
    try:
        got = drain(consumer, 1, timeout=20)
        assert [m.body for m in got] == [b"delayed"]
        assert time.time() >= deliver_at_s - 0.05, "delivered before its delivery time"
    finally:
        consumer.shutdown()


class ExampleChecker(TransactionChecker):
    """transaction_producer_example's checker, answering what the test decides."""

    def __init__(self, answer: TransactionResolution) -> None:
        self.answer = answer
        self.asked: list[str] = []

    def check(self, message: Message) -> TransactionResolution:
        self.asked.append(message.message_id)
        return self.answer


@pytest.mark.parametrize("answer", [TransactionResolution.COMMIT, TransactionResolution.ROLLBACK])
def test_transaction_example_resolved_by_check_back(
    server: ServerProcess, answer: TransactionResolution
) -> None:
    """``check_from_server = True``: the producer never ends the transaction itself."""
    topic, group = unique("txn"), unique("txn-group")
    server.create_topic(topic, "transaction", queues=2)
    checker = ExampleChecker(answer)
    producer = Producer(config(server), (topic,), checker=checker)
    producer.startup()
    try:
        transaction = producer.begin_transaction()
        msg = example_message(topic, "hello, rocketmq.", tag="rocketmq-send-transaction-message")
        receipt = producer.send(msg, transaction)
        assert receipt.transaction_id
        wait_until(lambda: receipt.message_id in checker.asked, 20, "the server's check")
    finally:
        producer.shutdown()

    consumer = SimpleConsumer(config(server), group, {topic: FilterExpression()})
    consumer.startup()
    try:
        if answer == TransactionResolution.COMMIT:
            got = drain(consumer, 1, timeout=20)
            assert [m.message_id for m in got] == [receipt.message_id]
        else:
            assert drain(consumer, 1, timeout=4) == [], "a rolled-back message was delivered"
    finally:
        consumer.shutdown()


def test_transaction_example_direct_commit_and_rollback(server: ServerProcess) -> None:
    topic, group = unique("txn-direct"), unique("txn-direct-group")
    server.create_topic(topic, "transaction", queues=2)
    checker = ExampleChecker(TransactionResolution.ROLLBACK)
    producer = Producer(config(server), (topic,), checker=checker)
    producer.startup()
    try:
        committed = producer.begin_transaction()
        kept = producer.send(example_message(topic, "committed"), committed)
        committed.commit()
        rolled_back = producer.begin_transaction()
        producer.send(example_message(topic, "rolled back"), rolled_back)
        rolled_back.rollback()
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config(server), group, {topic: FilterExpression()})
    consumer.startup()
    try:
        got = drain(consumer, 1, timeout=20)
        got += consumer.receive(32, 15)  # one more poll: the rolled-back one must not come
        assert [m.message_id for m in got] == [kept.message_id]
        assert checker.asked == [], "decided transactions were checked"
    finally:
        consumer.shutdown()


def test_recall_example_removes_a_delay_message_before_its_time(server: ServerProcess) -> None:
    topic, group = unique("recall"), unique("recall-group")
    server.create_topic(topic, "delay", queues=2)
    producer = Producer(config(server), (topic,))
    producer.startup()
    try:
        deliver_at_s = int(time.time()) + 3
        kept = producer.send(example_message(topic, "kept", delivery_timestamp=deliver_at_s))
        recalled = producer.send(
            example_message(topic, "recalled", delivery_timestamp=deliver_at_s)
        )
        assert producer.recall_message(topic, recalled.recall_handle) == recalled.message_id
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config(server), group, {topic: FilterExpression()})
    consumer.startup()
    try:
        got = drain(consumer, 1, timeout=20)
        got += consumer.receive(32, 15)
        assert [m.message_id for m in got] == [kept.message_id]
    finally:
        consumer.shutdown()


def test_push_consumer_quick_start_after_the_producer(server: ServerProcess) -> None:
    topic, group = unique("push"), unique("push-group")
    server.create_topic(topic, "normal", queues=4)
    producer = Producer(config(server), (topic,))
    producer.startup()
    try:
        sent = {producer.send(example_message(topic, f"m{i}")).message_id for i in range(10)}
    finally:
        producer.shutdown()
    listener = Recorder()
    consumer = PushConsumer(config(server), group, listener, {topic: FilterExpression()})
    consumer.startup()
    try:
        wait_until(lambda: len(listener.messages) >= 10, 30, "every message pushed")
        with listener.lock:
            assert sorted(m.message_id for m in listener.messages) == sorted(sent)
    finally:
        consumer.shutdown()
