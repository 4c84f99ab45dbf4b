"""Transactional messages through the official RocketMQ 5 Python client, unchanged.

The flows of RocketMQ's TransactionProducer example: a checker keeps a status
per transaction and answers COMMIT, ROLLBACK or UNKNOWN when the server asks.
The server runs with a short timeout, check interval and check limit so the
check service's work happens within the test.
"""

from __future__ import annotations

import collections
import threading
import time
import urllib.request

import pytest
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import TransactionSource

from tests.cluster.cluster_server import ClusterServer
from tests.server.conftest import ServerProcess, unique, wait_until

pytestmark = pytest.mark.slow

CHECK_MAX = 3
TRANSACTION_SETTINGS = (
    "transaction.timeout_ms=400ms",
    "transaction.check_interval_ms=250ms",
    f"transaction.check_max={CHECK_MAX}",
    "store.flush=sync",
)
# The wire has no UNKNOWN: an unspecified resolution means "I do not know yet".
UNKNOWN = TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED
# A long poll that ends this long after the commit that should have woken it was not woken.
WAKE_LIMIT_S = 2.0


@pytest.fixture(scope="module", params=["local", "cluster"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """``halfmoon serve``, or a cluster (etcd, two brokers, two proxies; the brokers take the
    transaction settings and ask for checks through the proxies): the same scenarios."""
    kind = {"local": ServerProcess, "cluster": ClusterServer}[request.param]
    proc = kind(
        tmp_path_factory.mktemp(f"halfmoon-txn-{request.param}"), settings=TRANSACTION_SETTINGS
    ).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


class StatusChecker(TransactionChecker):
    """RocketMQ's example checker: a status per transaction (by message id), counted asks."""

    def __init__(self) -> None:
        self.status: dict[str, TransactionResolution] = {}
        self.asked: collections.Counter[str] = collections.Counter()
        self.answered_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)

    def check(self, message: Message) -> TransactionResolution:
        with self._lock:
            self.asked[message.message_id] += 1
            answer = self.status.get(message.message_id, UNKNOWN)
            self.answered_at[message.message_id] = time.monotonic()
            self.changed.notify_all()
            return answer


def config(server: ServerProcess) -> ClientConfiguration:
    return ClientConfiguration(server.grpc, Credentials(), request_timeout=5)


def half(topic: str, body: str, key: str | None = None) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body.encode()
    if key:
        msg.keys = key
    return msg


def start_producer(server: ServerProcess, topic: str, checker: StatusChecker) -> Producer:
    producer = Producer(config(server), topics=(topic,), checker=checker)
    producer.startup()
    return producer


def start_consumer(
    server: ServerProcess, group: str, topic: str, await_duration: int = 2
) -> SimpleConsumer:
    consumer = SimpleConsumer(
        config(server), group, {topic: FilterExpression()}, await_duration=await_duration
    )
    consumer.startup()
    return consumer


def pending(server: ServerProcess, topic: str) -> list[dict]:
    code, body = server.admin_call("GET", f"/v1/transactions?topic={topic}")
    assert code == 200, body
    return body["transactions"]  # type: ignore[index]


def receive_and_ack(consumer: SimpleConsumer) -> list[Message]:
    got = consumer.receive(32, 15)
    for msg in got:
        consumer.ack(msg)
    return got


def test_example_flow_delivers_exactly_the_committed_messages_once(server: ServerProcess) -> None:
    topic, group = unique("txn"), unique("g")
    server.create_topic(topic, "transaction", queues=4)
    server.create_group(group)
    checker = StatusChecker()
    producer = start_producer(server, topic, checker)
    consumer = start_consumer(server, group, topic)
    try:
        expected: dict[str, str] = {}  # message id -> body, of everything that must be delivered
        halves: dict[str, str] = {}
        for i in range(12):
            body = f"order-{i}"
            transaction = producer.begin_transaction()
            sent = half(topic, body, key=f"k{i}")
            receipt = producer.send(sent, transaction)
            assert receipt.transaction_id
            halves[receipt.message_id] = body
            kind = i % 4
            if kind == 0:
                transaction.commit()
                expected[receipt.message_id] = body
            elif kind == 1:
                transaction.rollback()
            elif kind == 2:
                # The local transaction's outcome is unknown: say so; the checker will know.
                answer = producer.end_transaction(
                    receipt.message_queue.endpoints, sent, receipt.transaction_id,
                    UNKNOWN, TransactionSource.SOURCE_CLIENT,
                )  # fmt: skip
                assert answer.status.code == 20000, answer.status
                checker.status[receipt.message_id] = TransactionResolution.COMMIT
                expected[receipt.message_id] = body
            else:
                # The producer never answers; the checker first does not know, then rolls back.
                checker.status[receipt.message_id] = UNKNOWN
        # Half messages are invisible: nothing but the direct commits so far.
        first = receive_and_ack(consumer)
        assert {m.message_id for m in first} <= {
            mid for mid, b in expected.items() if int(b.split("-")[1]) % 4 == 0
        }
        for message_id, body in halves.items():
            if int(body.split("-")[1]) % 4 == 3:
                checker.status[message_id] = TransactionResolution.ROLLBACK

        got = list(first)
        deadline = time.monotonic() + 20
        while {m.message_id for m in got} != set(expected) and time.monotonic() < deadline:
            got += receive_and_ack(consumer)
        wait_until(lambda: not pending(server, topic), 15, "every transaction decided")
        got += receive_and_ack(consumer)  # anything late or doubled would show up now

        counts = collections.Counter(m.message_id for m in got)
        assert set(counts) == set(expected), (sorted(counts), sorted(expected))
        assert all(n == 1 for n in counts.values()), counts
        assert {m.message_id: m.body.decode() for m in got} == expected
        # Only the undecided ones were checked; each decided one never again.
        checked = {mid for mid in checker.asked}
        assert checked == {mid for mid, b in halves.items() if int(b.split("-")[1]) % 4 in (2, 3)}
        assert all(m.keys == {f"k{m.body.decode().split('-')[1]}"} for m in got)
    finally:
        consumer.shutdown()
        producer.shutdown()


def test_unknown_forever_is_parked_after_the_check_limit_and_resumes(server: ServerProcess) -> None:
    topic, group = unique("txn-park"), unique("g")
    server.create_topic(topic, "transaction", queues=2)
    server.create_group(group)
    checker = StatusChecker()
    producer = start_producer(server, topic, checker)
    consumer = start_consumer(server, group, topic, await_duration=1)
    try:
        receipt = producer.send(half(topic, "undecided"), producer.begin_transaction())

        def parked() -> list[dict]:
            code, body = server.admin_call("GET", "/v1/transactions/parked")
            assert code == 200, body
            return [
                t for t in body["transactions"] if t["transaction_id"] == receipt.transaction_id
            ]  # type: ignore[index]

        (entry,) = wait_until(parked, 20, "the transaction parked after the check limit")  # type: ignore[misc]
        assert entry["checks_sent"] == CHECK_MAX and entry["state"] == "parked"
        assert checker.asked[receipt.message_id] == CHECK_MAX
        # Parked: no more checks, still invisible.
        assert receive_and_ack(consumer) == []
        assert checker.asked[receipt.message_id] == CHECK_MAX

        checker.status[receipt.message_id] = TransactionResolution.COMMIT
        code, resumed = server.admin_call(
            "POST", f"/v1/transactions/{receipt.transaction_id}/resume"
        )
        assert code == 200, resumed
        assert resumed["state"] == "prepared" and resumed["checks_sent"] == 0  # type: ignore[index]
        got: list[Message] = []
        deadline = time.monotonic() + 15
        while not got and time.monotonic() < deadline:
            got = receive_and_ack(consumer)
        assert [m.body for m in got] == [b"undecided"]
        assert checker.asked[receipt.message_id] == CHECK_MAX + 1
        wait_until(lambda: not pending(server, topic), 10, "the transaction decided")
    finally:
        consumer.shutdown()
        producer.shutdown()


class LongPoll(threading.Thread):
    """One consumer long-polling (20 s) until a message comes; when it came."""

    def __init__(self, consumer: SimpleConsumer) -> None:
        super().__init__(daemon=True)
        self.consumer = consumer
        self.received_at: float | None = None
        self.messages: list[Message] = []

    def run(self) -> None:
        deadline = time.monotonic() + 30
        while not self.messages and time.monotonic() < deadline:
            self.messages = receive_and_ack(self.consumer)
        self.received_at = time.monotonic()


def parked_polls(server: ServerProcess) -> float:
    """Long polls parked on the server, or on every proxy of a cluster (the client may be
    connected to either)."""
    parked = 0.0
    for front in getattr(server, "proxies", [server]):
        with urllib.request.urlopen(front.admin + "/metrics", timeout=10) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if line.startswith("halfmoon_grpc_long_polls "):
                parked += float(line.split()[1])
    return parked


def test_commits_wake_long_polling_consumers(server: ServerProcess) -> None:
    """A commit, whether the producer's, a check answer's or a group's, wakes a parked long poll."""
    from halfmoon.client import Message as HalfmoonMessage
    from halfmoon.client import TransactionProducer
    from halfmoon.client import TransactionResolution as Resolution
    from tests.client.conftest import run

    topic, group = unique("txn-wake"), unique("g")
    server.create_topic(topic, "transaction", queues=2)
    server.create_group(group)
    checker = StatusChecker()
    producer = start_producer(server, topic, checker)
    # One consumer for every round: each round's message is the only new one it can get.
    consumer = start_consumer(server, group, topic, await_duration=20)
    try:

        def wait_for_commit(commit: callable) -> tuple[float, list[Message]]:  # type: ignore[valid-type]
            poll = LongPoll(consumer)
            # This module's server has no other consumer by now: wait for earlier polls to go.
            wait_until(lambda: parked_polls(server) == 0, 10, "earlier long polls gone")
            poll.start()
            wait_until(lambda: parked_polls(server) >= 1, 10, "the consumer's long poll parked")
            committed_at = commit()
            poll.join(30)
            assert poll.received_at is not None
            return poll.received_at - committed_at, poll.messages

        # 1. the producer's own commit
        def direct() -> float:
            transaction = producer.begin_transaction()
            producer.send(half(topic, "direct"), transaction)
            transaction.commit()
            return time.monotonic()

        lag, got = wait_for_commit(direct)
        assert [m.body for m in got] == [b"direct"] and lag < WAKE_LIMIT_S, lag

        # 2. a commit answered to a check
        def by_check() -> float:
            receipt = producer.send(half(topic, "checked"), producer.begin_transaction())
            checker.status[receipt.message_id] = TransactionResolution.COMMIT
            with checker.changed:
                assert checker.changed.wait_for(
                    lambda: receipt.message_id in checker.answered_at, 15
                )
            return checker.answered_at[receipt.message_id]

        lag, got = wait_for_commit(by_check)
        assert [m.body for m in got] == [b"checked"] and lag < WAKE_LIMIT_S, lag

        # 3. a transaction group's commit (halfmoon's client sends the group convention)
        class Never:
            def execute_local_transaction(self, message, arg):
                return Resolution.UNKNOWN

            def check_local_transaction(self, message):
                return Resolution.UNKNOWN

        def by_group() -> float:
            async def scenario() -> float:
                async with TransactionProducer(
                    server.grpc, unique("pg"), Never()
                ) as group_producer:
                    txn = group_producer.begin_group()
                    await txn.send(HalfmoonMessage(topic, b"group-1"))
                    await txn.send(HalfmoonMessage(topic, b"group-2"))
                    await txn.commit()
                    return time.monotonic()

            return run(scenario())

        lag, got = wait_for_commit(by_group)
        assert {m.body for m in got} <= {b"group-1", b"group-2"} and got and lag < WAKE_LIMIT_S, lag
    finally:
        consumer.shutdown()
        producer.shutdown()
