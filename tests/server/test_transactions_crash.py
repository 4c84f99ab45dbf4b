"""Transactions across crashes: real processes, killed with SIGKILL.

1. A producer process dies between the two phases; a second producer of the
   same topic (another process) resolves its transactions through checks.
2. The broker dies with transactions pending; after the restart nothing
   committed is lost or doubled, EndTransaction still works with the old
   transaction ids, and checks resume.
3. The broker dies in the middle of committing a transaction group; after
   the restart the group is all or nothing, each member exactly once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import grpc
import pytest
from google.protobuf import duration_pb2
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
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc

from tests.server.conftest import ROOT, ServerProcess, unique, wait_until

pytestmark = pytest.mark.slow

pb = definition_pb2
svc = service_pb2
SETTINGS = (
    "store.flush=sync",
    "transaction.timeout_ms=300ms",
    "transaction.check_interval_ms=200ms",
    "transaction.check_max=8",
    "transaction.snapshot_interval_ms=200ms",
)

# The producer that dies: sends half messages, prints their ids, commits the first
# `commit` of them, then waits to be killed without deciding the rest.
_CHILD = r"""
import json, sys
from rocketmq import (
    ClientConfiguration, Credentials, Message, Producer, TransactionChecker, TransactionResolution,
)

class Unsure(TransactionChecker):
    def check(self, message):
        return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED

endpoint, topic, count, commit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
config = ClientConfiguration(endpoint, Credentials(), request_timeout=5)
producer = Producer(config, topics=(topic,), checker=Unsure())
producer.startup()
for i in range(count):
    msg = Message()
    msg.topic = topic
    msg.body = f"order-{i}".encode()
    transaction = producer.begin_transaction()
    receipt = producer.send(msg, transaction)
    if i < commit:
        transaction.commit()
    line = {"body": f"order-{i}", "message_id": receipt.message_id,
            "transaction_id": receipt.transaction_id}
    print(json.dumps(line), flush=True)
print("SENT", flush=True)
sys.stdin.read()  # until killed
"""


class BodyChecker(TransactionChecker):
    """Decides by body: even order numbers commit, odd ones roll back."""

    def __init__(self) -> None:
        self.asked: collections.Counter[str] = collections.Counter()

    def check(self, message: Message) -> TransactionResolution:
        body = message.body.decode()
        self.asked[body] += 1
        number = int(body.rsplit("-", 1)[1])
        return TransactionResolution.COMMIT if number % 2 == 0 else TransactionResolution.ROLLBACK


def client_config(server: ServerProcess) -> ClientConfiguration:
    return ClientConfiguration(server.grpc, Credentials(), request_timeout=5)


def consume_all(
    server: ServerProcess, group: str, topic: str, want: int, timeout: float
) -> collections.Counter[str]:
    """Bodies received (and acked) until ``want`` arrived, then one more look for extras."""
    consumer = SimpleConsumer(
        client_config(server), group, {topic: FilterExpression()}, await_duration=1
    )
    consumer.startup()
    got: collections.Counter[str] = collections.Counter()
    try:
        deadline = time.monotonic() + timeout
        while sum(got.values()) < want and time.monotonic() < deadline:
            for msg in consumer.receive(32, 30):
                got[msg.body.decode()] += 1
                consumer.ack(msg)
        for msg in consumer.receive(32, 30):  # a doubled message would show up here
            got[msg.body.decode()] += 1
            consumer.ack(msg)
    finally:
        consumer.shutdown()
    return got


def pending(server: ServerProcess, topic: str) -> list[dict]:
    code, body = server.admin_call("GET", f"/v1/transactions?topic={topic}&limit=100000")
    assert code == 200, body
    return body["transactions"]  # type: ignore[index]


def topic_messages(server: ServerProcess, topic: str) -> int:
    code, body = server.admin_call("GET", f"/v1/topics/{topic}/status")
    assert code == 200, body
    return sum(q["max_offset"] - q["min_offset"] for q in body["queues"])  # type: ignore[index]


def end_transaction(
    server: ServerProcess, topic: str, transaction_id: str, commit: bool, message_id: str = ""
) -> svc.EndTransactionResponse:
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        return stub.EndTransaction(
            svc.EndTransactionRequest(
                topic=pb.Resource(name=topic),
                message_id=message_id,
                transaction_id=transaction_id,
                resolution=pb.TransactionResolution.COMMIT
                if commit
                else pb.TransactionResolution.ROLLBACK,
                source=pb.TransactionSource.SOURCE_CLIENT,
            ),
            timeout=30,
        )


def test_producer_killed_between_phases_is_resolved_by_another_producer(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory(settings=SETTINGS).start()
    topic, group = unique("txn-kill"), unique("g")
    server.create_topic(topic, "transaction", queues=4)
    server.create_group(group)
    count, committed_first = 10, 3
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, server.grpc, topic, str(count), str(committed_first)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    sent = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith("SENT"):
                break
            sent.append(json.loads(line))
        assert len(sent) == count, "the producer process did not send its half messages"
    finally:
        child.kill()  # SIGKILL: between the two phases of the undecided ones
        child.wait(10)

    checker = BodyChecker()
    second = Producer(client_config(server), topics=(topic,), checker=checker)
    second.startup()
    try:
        wait_until(
            lambda: not pending(server, topic),
            30,
            "the second producer to resolve every transaction",
        )
    finally:
        second.shutdown()
    undecided = [s["body"] for s in sent[committed_first:]]
    # Every undecided one was checked; the dead producer could answer none of them.
    assert set(checker.asked) == set(undecided), checker.asked
    expected = {s["body"] for s in sent[:committed_first]} | {
        b for b in undecided if int(b.rsplit("-", 1)[1]) % 2 == 0
    }
    got = consume_all(server, group, topic, len(expected), timeout=20)
    assert set(got) == expected and all(n == 1 for n in got.values()), got


def test_broker_killed_with_pending_transactions_loses_and_doubles_nothing(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory(settings=SETTINGS).start()
    topic, group = unique("txn-crash"), unique("g")
    server.create_topic(topic, "transaction", queues=4)
    server.create_group(group)

    class Silent(TransactionChecker):
        def check(self, message: Message) -> TransactionResolution:
            return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED

    producer = Producer(client_config(server), topics=(topic,), checker=Silent())
    producer.startup()
    receipts = {}
    try:
        for i in range(12):
            msg = Message()
            msg.topic = topic
            msg.body = f"order-{i}".encode()
            transaction = producer.begin_transaction()
            receipts[f"order-{i}"] = producer.send(msg, transaction)
            if i < 4:
                transaction.commit()
            elif i < 6:
                transaction.rollback()
    finally:
        producer.shutdown()
    assert len(pending(server, topic)) == 6
    server.kill()  # SIGKILL, with six transactions undecided

    server.start()
    assert {t["transaction_id"] for t in pending(server, topic)} == {
        receipts[f"order-{i}"].transaction_id for i in range(6, 12)
    }
    assert topic_messages(server, topic) == 4  # the commits survived; nothing re-published
    # EndTransaction with an id issued before the restart (RocketMQ's proxy loses these).
    answer = end_transaction(
        server,
        topic,
        receipts["order-6"].transaction_id,
        commit=True,
        message_id=receipts["order-6"].message_id,
    )
    assert answer.status.code == pb.Code.OK, answer.status
    answer = end_transaction(server, topic, receipts["order-0"].transaction_id, commit=True)
    assert answer.status.code == pb.Code.OK, answer.status  # committing again: a no-op
    answer = end_transaction(server, topic, receipts["order-4"].transaction_id, commit=True)
    assert answer.status.code == pb.Code.BAD_REQUEST and "rolled back" in answer.status.message, (
        answer.status
    )
    answer = end_transaction(server, topic, "T" + "0" * 24, commit=True)
    assert answer.status.code == pb.Code.INVALID_TRANSACTION_ID, answer.status

    # Checks resume: a producer of the topic decides the rest (7, 9, 11 roll back).
    checker = BodyChecker()
    resolver = Producer(client_config(server), topics=(topic,), checker=checker)
    resolver.startup()
    try:
        wait_until(
            lambda: not pending(server, topic),
            30,
            "checks to resolve the transactions after the restart",
        )
    finally:
        resolver.shutdown()
    assert set(checker.asked) == {f"order-{i}" for i in range(7, 12)}
    expected = {f"order-{i}" for i in (0, 1, 2, 3, 6, 8, 10)}
    got = consume_all(server, group, topic, len(expected), timeout=20)
    assert set(got) == expected and all(n == 1 for n in got.values()), got


def _group_half(topic: str, group_id: str, i: int) -> pb.Message:
    return pb.Message(
        topic=pb.Resource(name=topic),
        user_properties={"__HM_TXN_GROUP": group_id},
        system_properties=pb.SystemProperties(
            message_type=pb.MessageType.TRANSACTION,
            body_encoding=pb.Encoding.IDENTITY,
            born_host="127.0.0.1",
        ),
        body=f"member-{i}".encode(),
    )


def test_broker_killed_mid_group_commit_keeps_the_group_atomic(
    server_factory: Callable[..., ServerProcess],
) -> None:
    # One member per append makes the group's commit long enough to be cut in the middle.
    server = server_factory(settings=(*SETTINGS, "transaction.group_batch_size=1")).start()
    topic, group = unique("txn-group"), unique("g")
    server.create_topic(topic, "transaction", queues=4)
    server.create_group(group)
    members = 1500
    # Where the kill lands is up to the scheduler: try a few groups until one is
    # cut mid-commit. Every round, cut or not, must recover to exactly once.
    published = 0
    cut_mid_commit = False
    for _ in range(3):
        group_id = unique("batch")
        seen = _kill_during_group_commit(server, topic, group_id, members)
        cut_mid_commit = 0 < seen - published < members
        server.start()
        # Recovery finishes the group: the decision was durable before any member was published.
        wait_until(lambda: not pending(server, topic), 20, "recovery to finish the group's commit")
        published += members
        assert topic_messages(server, topic) == published
        # The producer's retry of the commit it never got an answer to: a no-op now.
        answer = end_transaction(server, topic, f"hm-group:{group_id}", commit=True)
        assert answer.status.code == pb.Code.OK, answer.status
        answer = end_transaction(server, topic, f"hm-group:{group_id}", commit=False)
        assert answer.status.code == pb.Code.BAD_REQUEST, answer.status
        assert topic_messages(server, topic) == published
        if cut_mid_commit:
            break
    assert cut_mid_commit, "in three tries the kill never landed in the middle of a group commit"
    got = consume_all(server, group, topic, published, timeout=40)
    assert len(got) == published and all(n == 1 for n in got.values())


def _kill_during_group_commit(
    server: ServerProcess, topic: str, group_id: str, members: int
) -> int:
    """Send a group of half messages, start its commit, SIGKILL the broker once some are out.

    Returns how many messages the topic held at the kill.
    """
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for start in range(0, members, 500):
            answer = stub.SendMessage(
                svc.SendMessageRequest(
                    messages=[_group_half(topic, group_id, i) for i in range(start, start + 500)]
                ),
                timeout=30,
            )
            assert answer.status.code == pb.Code.OK, answer.status
        before = topic_messages(server, topic)
        assert len(pending(server, topic)) == members
        commit = stub.EndTransaction.future(
            svc.EndTransactionRequest(
                topic=pb.Resource(name=topic),
                transaction_id=f"hm-group:{group_id}",
                resolution=pb.TransactionResolution.COMMIT,
                source=pb.TransactionSource.SOURCE_CLIENT,
            ),
            timeout=60,
        )
        seen = before
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and seen == before:
            seen = topic_messages(server, topic)
        server.kill()  # SIGKILL while the members are being published
        with contextlib.suppress(grpc.RpcError):  # usually: the broker died before answering
            commit.result()
    return seen


def test_broker_killed_during_a_burst_of_decisions_keeps_every_acknowledged_one(
    server_factory: Callable[..., ServerProcess],
) -> None:
    """Hundreds of EndTransactions in flight at once are decided in shared appends (the server
    batches those that arrive while an fsync runs). SIGKILL in the middle: every acknowledged
    commit is published exactly once, every acknowledged rollback is gone, the rest is either
    decided or still pending (never both, never doubled), and checks finish them after the
    restart."""
    server = server_factory(settings=SETTINGS).start()
    topic, group = unique("txn-burst"), unique("g")
    server.create_topic(topic, "transaction", queues=4)
    server.create_group(group)
    count = 600
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        answer = stub.SendMessage(
            svc.SendMessageRequest(
                messages=[
                    pb.Message(
                        topic=pb.Resource(name=topic),
                        body=f"order-{i}".encode(),
                        system_properties=pb.SystemProperties(
                            message_id=f"burst-{i:06d}",
                            message_type=pb.MessageType.TRANSACTION,
                            body_encoding=pb.Encoding.IDENTITY,
                            born_host="127.0.0.1",
                            # Not checked before the restart: only the burst decides them.
                            orphaned_transaction_recovery_duration=duration_pb2.Duration(
                                seconds=30
                            ),
                        ),
                    )
                    for i in range(count)
                ]
            ),
            timeout=30,
        )
        assert answer.status.code == pb.Code.OK, answer.status
        entries = list(answer.entries)
    acknowledged = asyncio.run(_decide_until_killed(server, topic, entries, kill_after=count // 4))
    assert count // 4 <= len(acknowledged) < count, len(acknowledged)

    server.start()
    left = {t["transaction_id"] for t in pending(server, topic)}
    committed_after = topic_messages(server, topic)
    for i, entry in enumerate(entries):
        if i in acknowledged:
            assert entry.transaction_id not in left, f"order-{i} was acknowledged, still pending"
    # Checks resume (even orders commit, odd ones roll back, as the burst decided them).
    checker = BodyChecker()
    resolver = Producer(client_config(server), topics=(topic,), checker=checker)
    resolver.startup()
    try:
        wait_until(lambda: not pending(server, topic), 60, "checks to decide the rest")
    finally:
        resolver.shutdown()
    assert not {f"order-{i}" for i in acknowledged} & set(checker.asked)
    assert committed_after >= sum(1 for i in acknowledged if i % 2 == 0)
    expected = {f"order-{i}" for i in range(0, count, 2)}
    got = consume_all(server, group, topic, len(expected), timeout=60)
    assert set(got) == expected and all(n == 1 for n in got.values()), got


async def _decide_until_killed(
    server: ServerProcess, topic: str, entries: list[svc.SendResultEntry], kill_after: int
) -> set[int]:
    """EndTransaction for every entry at once (even: commit, odd: roll back); SIGKILL the broker
    once ``kill_after`` are acknowledged. The indices acknowledged OK."""
    acknowledged: set[int] = set()
    killed = asyncio.Event()
    async with grpc.aio.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)

        async def decide(i: int, entry: svc.SendResultEntry) -> None:
            request = svc.EndTransactionRequest(
                topic=pb.Resource(name=topic),
                message_id=entry.message_id,
                transaction_id=entry.transaction_id,
                resolution=pb.TransactionResolution.COMMIT
                if i % 2 == 0
                else pb.TransactionResolution.ROLLBACK,
                source=pb.TransactionSource.SOURCE_CLIENT,
            )
            try:
                answer = await stub.EndTransaction(request, timeout=30)
            except grpc.aio.AioRpcError:
                return  # the broker died first: not acknowledged
            if answer.status.code == pb.Code.OK and not killed.is_set():
                acknowledged.add(i)
                if len(acknowledged) >= kill_after:
                    killed.set()
                    server.kill()  # SIGKILL, with the rest of the burst in flight

        await asyncio.gather(*(decide(i, e) for i, e in enumerate(entries)))
    return acknowledged
