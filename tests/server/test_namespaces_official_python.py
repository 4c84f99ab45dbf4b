"""Namespaces with the official Python client: tenants with the same names stay apart.

Two clients configured with different ``ClientConfiguration`` namespaces use
the same topic and group names; each sees only its own messages, named as it
named them (``message.topic``) with its namespace (``message.namespace``),
while the broker stores ``namespace%name`` as RocketMQ does.
"""

from __future__ import annotations

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
from rocketmq.grpc_protocol import TransactionSource

from tests.server.conftest import ServerProcess, unique, wait_until

pytestmark = pytest.mark.slow

UNKNOWN = TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    # Quick transaction checks, for the check-over-telemetry test.
    settings = ("transaction.timeout_ms=400ms", "transaction.check_interval_ms=250ms")
    proc = ServerProcess(tmp_path_factory.mktemp("halfmoon-ns"), settings=settings).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


def config(server: ServerProcess, namespace: str) -> ClientConfiguration:
    return ClientConfiguration(server.grpc, Credentials(), namespace=namespace, request_timeout=5)


def message(topic: str, body: str) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body.encode()
    return msg


def admin(server: ServerProcess, method: str, path: str, body: dict | None = None) -> object:
    code, answer = server.admin_call(method, path, body)
    assert code in (200, 201), (method, path, code, answer)
    return answer


def create(
    server: ServerProcess, namespace: str, topic: str, group: str, kind: str = "normal"
) -> None:
    query = f"?namespace={namespace}"
    admin(
        server,
        "POST",
        "/v1/topics" + query,
        {"name": topic, "message_type": kind, "queue_count": 2},
    )
    admin(server, "POST", "/v1/groups" + query, {"name": group, "consume_from": "earliest"})


def receive_all(consumer: SimpleConsumer, count: int, timeout: float) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for msg in consumer.receive(32, 15):
            got.append(msg)
            consumer.ack(msg)
    return got


def test_two_namespaces_with_the_same_names_do_not_see_each_others_messages(
    server: ServerProcess,
) -> None:
    topic, group = unique("orders"), unique("billing")
    tenants = ("tenant-a", "tenant-b")
    for namespace in tenants:
        create(server, namespace, topic, group)
    producers, consumers = {}, {}
    try:
        for namespace in tenants:
            producers[namespace] = Producer(config(server, namespace), topics=(topic,))
            producers[namespace].startup()
            consumers[namespace] = SimpleConsumer(
                config(server, namespace), group, {topic: FilterExpression()}, await_duration=2
            )
            consumers[namespace].startup()
        sent: dict[str, set[str]] = {}
        for namespace, producer in producers.items():
            sent[namespace] = {
                producer.send(message(topic, f"{namespace}-{i}")).message_id for i in range(4)
            }
        for namespace, consumer in consumers.items():
            got = receive_all(consumer, 4, timeout=15)
            assert {m.message_id for m in got} == sent[namespace]
            assert {m.body.decode().rsplit("-", 1)[0] for m in got} == {namespace}
            assert all(m.topic == topic and m.namespace == namespace for m in got)
            assert consumer.receive(32, 15) == []  # acked, and nothing of the other tenant
    finally:
        for client in [*consumers.values(), *producers.values()]:
            client.shutdown()

    # The broker holds one topic per tenant under its stored name, and none without one.
    assert server.admin_call("GET", f"/v1/topics/{topic}")[0] == 404
    listed = admin(server, "GET", "/v1/topics?namespace=tenant-a")
    assert [t["name"] for t in listed["topics"]] == [f"tenant-a%{topic}"]  # type: ignore[index]
    stored = admin(server, "GET", f"/v1/topics/tenant-b%25{topic}/status")
    assert sum(q["max_offset"] for q in stored["queues"]) == 4  # type: ignore[index]


def test_a_client_without_namespace_does_not_reach_a_namespaced_topic(
    server: ServerProcess,
) -> None:
    topic, group = unique("solo"), unique("g")
    create(server, "tenant-c", topic, group)
    producer = Producer(config(server, ""), topics=())
    producer.startup()
    try:
        # The client reports "failed to fetch topic route"; the server's reason is in its log.
        with pytest.raises(Exception, match=f"topic:{topic} route"):
            producer.send(message(topic, "lost"))
    finally:
        producer.shutdown()


class Recorder(MessageListener):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.seen.append((message.topic, message.namespace, message.delivery_attempt))
        return ConsumeResult.FAILURE


def test_dead_letters_stay_in_the_namespace_as_percent_dlq_namespace_group(
    server: ServerProcess,
) -> None:
    namespace, topic, group = "tenant-d", unique("poison"), unique("gdead")
    create(server, namespace, topic, group)
    admin(
        server, "PATCH", f"/v1/groups/{group}?namespace={namespace}",
        {"max_delivery_attempts": 2, "retry_policy": {"kind": "customized", "levels_ms": [500]}},
    )  # fmt: skip
    listener = Recorder()
    consumer = PushConsumer(config(server, namespace), group, listener, {topic: FilterExpression()})
    consumer.startup()
    producer = Producer(config(server, namespace), topics=(topic,))
    producer.startup()
    reader = None
    try:
        receipt = producer.send(message(topic, "poison"))
        stored_dlq = f"%DLQ%{namespace}%{group}"
        wait_until(
            lambda: (
                server.admin_call("GET", f"/v1/topics/{stored_dlq.replace('%', '%25')}")[0] == 200
            ),
            20,
            "the namespaced dead-letter topic",
        )
        assert listener.seen[:2] == [(topic, namespace, 1), (topic, namespace, 2)]
        # Read back the way a tenant names it: %DLQ%<group> in its namespace.
        reader_group = unique("gdlq")
        admin(
            server,
            "POST",
            f"/v1/groups?namespace={namespace}",
            {"name": reader_group, "consume_from": "earliest"},
        )
        reader = SimpleConsumer(
            config(server, namespace),
            reader_group,
            {f"%DLQ%{group}": FilterExpression()},
            await_duration=2,
        )
        reader.startup()
        [dead] = receive_all(reader, 1, timeout=15)
        assert dead.message_id == receipt.message_id
        assert (dead.topic, dead.namespace) == (f"%DLQ%{group}", namespace)
        assert server.admin_call("GET", f"/v1/topics/%25DLQ%25{group}")[0] == 404
    finally:
        for client in (reader, consumer, producer):
            if client is not None:
                client.shutdown()


class AskedChecker(TransactionChecker):
    def __init__(self) -> None:
        self.asked: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()

    def check(self, message: Message) -> TransactionResolution:
        with self.lock:
            self.asked.append((message.message_id, message.topic, message.namespace))
        return TransactionResolution.COMMIT


def test_transaction_checks_reach_the_namespaced_producer_with_its_names(
    server: ServerProcess,
) -> None:
    namespace, topic, group = "tenant-t", unique("txn"), unique("gtxn")
    create(server, namespace, topic, group, kind="transaction")
    checker = AskedChecker()
    producer = Producer(config(server, namespace), topics=(topic,), checker=checker)
    producer.startup()
    consumer = SimpleConsumer(
        config(server, namespace), group, {topic: FilterExpression()}, await_duration=2
    )
    consumer.startup()
    try:
        transaction = producer.begin_transaction()
        half = message(topic, "maybe")
        receipt = producer.send(half, transaction)
        answer = producer.end_transaction(
            receipt.message_queue.endpoints, half, receipt.transaction_id,
            UNKNOWN, TransactionSource.SOURCE_CLIENT,
        )  # fmt: skip
        assert answer.status.code == 20000, answer.status
        wait_until(lambda: checker.asked, 20, "a transaction check")
        assert checker.asked[0] == (receipt.message_id, topic, namespace)
        [committed] = receive_all(consumer, 1, timeout=15)
        assert committed.message_id == receipt.message_id
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_an_illegal_namespace_is_refused_with_its_reason(
    server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    topic = unique("bad")
    producer = Producer(config(server, "no%percent"), topics=())
    producer.startup()
    try:
        with pytest.raises(Exception, match=f"topic:{topic} route"):
            producer.send(message(topic, "x"))
    finally:
        producer.shutdown()
    # The client logs the server's answer: code 40000 (BAD_REQUEST) and the reason.
    assert any(
        "40000" in r.getMessage() and "illegal namespace 'no%percent'" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
