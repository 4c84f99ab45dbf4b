"""Transactional producer and the synchronous facade against a real server."""

from __future__ import annotations

import asyncio

import pytest

from halfmoon.client import (
    Message,
    MessageSelector,
    SimpleConsumer,
    SyncProducer,
    SyncSimpleConsumer,
    TransactionProducer,
    TransactionResolution,
    Unsupported,
)
from tests.client.conftest import ServerProcess, run, unique


class Listener:
    def __init__(self) -> None:
        self.checked: list[str] = []

    def execute_local_transaction(self, message, arg):
        return arg

    def check_local_transaction(self, message):
        self.checked.append(message.message_id)
        return TransactionResolution.COMMIT


async def bodies(consumer: SimpleConsumer, wait: float) -> set[bytes]:
    got = await consumer.receive(32, 20, wait=wait)
    for m in got:
        await consumer.ack(m)
    return {m.body for m in got}


def test_transactional_send_commit_rollback_and_group(server: ServerProcess) -> None:
    topic, group = unique("txn"), unique("txn-g")
    server.create_topic(topic, message_type="transaction")
    server.create_group(group)

    async def scenario() -> None:
        async with (
            TransactionProducer(server.grpc, unique("pg"), Listener()) as producer,
            SimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer,
        ):
            try:
                committed = await producer.send_message_in_transaction(
                    Message(topic, b"commit"), TransactionResolution.COMMIT
                )
            except Unsupported as exc:
                pytest.skip(f"server has no EndTransaction yet: {exc}")
            assert committed.receipt.transaction_id
            await producer.send_message_in_transaction(
                Message(topic, b"rollback"), TransactionResolution.ROLLBACK
            )
            unknown = await producer.send_message_in_transaction(
                Message(topic, b"unknown"), TransactionResolution.UNKNOWN
            )
            assert unknown.resolution is TransactionResolution.UNKNOWN
            assert await bodies(consumer, 1.0) == {b"commit"}
            # The lower-level API: two half messages, one commit.
            txn = producer.begin()
            await txn.send(Message(topic, b"t1"))
            await txn.send(Message(topic, b"t2"))
            assert await bodies(consumer, 0.5) == set()
            await txn.commit()
            got: set[bytes] = set()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while got != {b"t1", b"t2"} and loop.time() < deadline:
                got |= await bodies(consumer, 1.0)
            assert got == {b"t1", b"t2"}

    run(scenario())


def test_transaction_group_commits_atomically(server: ServerProcess) -> None:
    topic, group = unique("txg"), unique("txg-g")
    server.create_topic(topic, message_type="transaction")
    server.create_group(group)

    async def scenario() -> None:
        async with (
            TransactionProducer(server.grpc, unique("pg"), Listener()) as producer,
            SimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer,
        ):
            txn = producer.begin_group()
            await txn.send(Message(topic, b"g1"))
            await txn.send(Message(topic, b"g2"))
            assert await bodies(consumer, 0.5) == set()
            await txn.commit()
            got: set[bytes] = set()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while got != {b"g1", b"g2"} and loop.time() < deadline:
                got |= await bodies(consumer, 1.0)
            assert got == {b"g1", b"g2"}

    run(scenario())


def test_sync_facade_round_trip(server: ServerProcess) -> None:
    topic, group = unique("sync"), unique("sync-g")
    server.create_topic(topic)
    server.create_group(group)
    with (
        SyncProducer(server.grpc) as producer,
        SyncSimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer,
    ):
        receipts = producer.send_batch([Message(topic, f"s{i}".encode()) for i in range(5)])
        got = []
        for _ in range(10):
            batch = consumer.receive(16, 20, wait=1.0)
            for m in batch:
                consumer.ack(m)
            got.extend(batch)
            if len(got) >= 5:
                break
        assert sorted(m.message_id for m in got) == sorted(r.message_id for r in receipts)


def test_a_check_asked_again_before_it_is_answered_is_answered_once() -> None:
    """The broker may repeat a check it counts as lost while the first still waits at the
    producer; the producer answers the transaction once, and a later check again."""
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as svc

    class Slow:
        def __init__(self) -> None:
            self.asked: list[str] = []
            self.release = asyncio.Event()

        def execute_local_transaction(self, message, arg):
            return arg

        async def check_local_transaction(self, message):
            self.asked.append(message.message_id)
            await self.release.wait()
            return TransactionResolution.UNKNOWN  # no EndTransaction: no server needed

    def check(transaction_id: str) -> svc.TelemetryCommand:
        message = pb.Message(topic=pb.Resource(name="orders"), body=b"x")
        message.system_properties.message_id = f"m-{transaction_id}"
        return svc.TelemetryCommand(
            recover_orphaned_transaction_command=svc.RecoverOrphanedTransactionCommand(
                message=message, transaction_id=transaction_id
            )
        )

    async def scenario() -> None:
        listener = Slow()
        producer = TransactionProducer("127.0.0.1:1", "pg", listener, check_workers=2)
        for tid in ("T1", "T1", "T2", "T1"):
            await producer._on_command("127.0.0.1:1", check(tid))
        assert (producer.checks_received, producer.checks_held) == (4, 2)
        listener.release.set()
        deadline = asyncio.get_running_loop().time() + 10
        while producer.checks_held:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        assert sorted(listener.asked) == ["m-T1", "m-T2"]
        await producer._on_command("127.0.0.1:1", check("T1"))  # answered: asked again
        while producer.checks_held:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        assert sorted(listener.asked) == ["m-T1", "m-T1", "m-T2"]
        await producer._on_closing()

    asyncio.run(scenario())
