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
