"""Simple and push consumers against a real server: invisibility, retries to dead letters,
broadcasting."""

from __future__ import annotations

import asyncio

import pytest

from halfmoon.client import (
    BROADCASTING,
    ConsumeResult,
    IllegalFilterExpression,
    InvalidReceiptHandle,
    Message,
    MessageSelector,
    Producer,
    PushConsumer,
    SimpleConsumer,
)
from tests.client.conftest import ServerProcess, run, unique
from tests.waiting import until


def test_simple_consumer_ack_and_invisible_duration(server: ServerProcess) -> None:
    topic, group = unique("simple"), unique("simple-g")
    server.create_topic(topic)
    server.create_group(group)

    async def scenario() -> None:
        async with (
            Producer(server.grpc) as producer,
            SimpleConsumer(
                server.grpc, group, {topic: MessageSelector.by_tag("A || B")}
            ) as consumer,
        ):
            await producer.send(Message(topic, b"a", tag="A"))
            await producer.send(Message(topic, b"c", tag="C"))
            [first] = await consumer.receive(10, 20, wait=3)
            assert first.body == b"a" and first.delivery_attempt == 1
            # Ask for an early redelivery: the same message comes back, attempt 2.
            old_handle = first.receipt_handle
            await consumer.change_invisible_duration(first, 0.2)
            assert first.receipt_handle != old_handle
            [again] = await consumer.receive(10, 20, wait=3)
            assert again.message_id == first.message_id and again.delivery_attempt == 2
            # The superseded handle no longer acks; the fresh one does.
            with pytest.raises(InvalidReceiptHandle):
                await consumer.ack(first)
            await consumer.ack(again)
            assert await consumer.receive(10, 20, wait=0.5) == []  # C filtered out, A consumed

    run(scenario())


def test_bad_sql_selector_is_a_typed_error(server: ServerProcess) -> None:
    topic, group = unique("badsql"), unique("badsql-g")
    server.create_topic(topic)
    server.create_group(group)

    async def scenario() -> None:
        consumer = SimpleConsumer(server.grpc, group, {topic: MessageSelector.by_sql("a > ")})
        with pytest.raises(IllegalFilterExpression):
            await consumer.start()
        assert consumer.closed

    run(scenario())


def test_sql_selector_filters_on_properties(server: ServerProcess) -> None:
    topic, group = unique("sql"), unique("sql-g")
    server.create_topic(topic)
    server.create_group(group)

    async def scenario() -> None:
        async with (
            Producer(server.grpc) as producer,
            SimpleConsumer(
                server.grpc, group, {topic: MessageSelector.by_sql("a > 5")}
            ) as consumer,
        ):
            for a in (1, 7, 3, 9):
                await producer.send(Message(topic, f"a={a}".encode(), properties={"a": str(a)}))
            got = []
            for _ in range(10):
                batch = await consumer.receive(10, 20, wait=0.5)
                got.extend(batch)
                for m in batch:
                    await consumer.ack(m)
                if len(got) >= 2:
                    break
            assert sorted(m.body for m in got) == [b"a=7", b"a=9"]

    run(scenario())


def test_push_consumer_retries_then_dead_letters(server: ServerProcess) -> None:
    topic, group = unique("push"), unique("push-g")
    server.create_topic(topic)
    server.create_group(
        group, max_delivery_attempts=3, retry_policy={"kind": "customized", "levels_ms": [100]}
    )
    dlq_reader = unique("dlq-reader")
    server.create_group(dlq_reader)

    async def scenario() -> None:
        attempts: dict[bytes, list[int]] = {}

        def listener(message):
            attempts.setdefault(message.body, []).append(message.delivery_attempt)
            if message.body == b"poison":
                raise RuntimeError("cannot process")
            return ConsumeResult.LATER if len(attempts[message.body]) < 2 else ConsumeResult.SUCCESS

        async with (
            Producer(server.grpc) as producer,
            PushConsumer(server.grpc, group, {topic: MessageSelector.all()}, listener) as consumer,
        ):
            assert consumer.max_attempts == 3
            await producer.send(Message(topic, b"poison"))
            await producer.send(Message(topic, b"flaky"))
            await until(
                lambda: consumer.dead_lettered == 1 and consumer.consumed == 1,
                20,
                "one dead letter and one success",
            )
            assert attempts[b"poison"] == [1, 2, 3]
            assert attempts[b"flaky"] == [1, 2]
        async with SimpleConsumer(
            server.grpc, dlq_reader, {f"%DLQ%{group}": MessageSelector.all()}
        ) as reader:
            dead = await reader.receive(10, 20, wait=5)
            assert [m.body for m in dead] == [b"poison"]

    run(scenario())


def test_push_consumer_orderly_keeps_group_order_across_retries(server: ServerProcess) -> None:
    topic, group = unique("push-fifo"), unique("push-fifo-g")
    server.create_topic(topic, message_type="fifo")
    server.create_group(group, fifo=True, retry_policy={"kind": "customized", "levels_ms": [100]})

    async def scenario() -> None:
        seen: dict[str, list[int]] = {}
        failed_once: set[int] = set()

        async def listener(message):
            n = int(message.body)
            if n % 4 == 1 and n not in failed_once:
                failed_once.add(n)
                return ConsumeResult.LATER
            seen.setdefault(message.message_group, []).append(n)
            return ConsumeResult.SUCCESS

        async with (
            Producer(server.grpc) as producer,
            PushConsumer(server.grpc, group, {topic: MessageSelector.all()}, listener) as consumer,
        ):
            assert consumer.orderly
            for n in range(12):
                await producer.send(Message(topic, str(n).encode(), message_group=f"g{n % 2}"))
            await until(lambda: sum(len(v) for v in seen.values()) == 12, 20, "all twelve consumed")
            assert seen == {"g0": [0, 2, 4, 6, 8, 10], "g1": [1, 3, 5, 7, 9, 11]}

    run(scenario())


def test_broadcasting_each_consumer_sees_everything(server: ServerProcess) -> None:
    topic, group = unique("bcast"), unique("bcast-g")
    server.create_topic(topic, queues=3)
    server.create_group(group, broadcast=True)

    async def scenario() -> None:
        seen: list[list[bytes]] = [[], [], []]

        def recorder(into: list[bytes]):
            return lambda message: into.append(message.body)

        consumers = [
            PushConsumer(
                server.grpc,
                group,
                {topic: MessageSelector.all()},
                recorder(s),
                message_model=BROADCASTING,
            )
            for s in seen
        ]
        for consumer in consumers:
            await consumer.start()
        try:
            async with Producer(server.grpc) as producer:
                for n in range(30):
                    await producer.send(Message(topic, f"b{n}".encode()))
            expected = sorted(f"b{n}".encode() for n in range(30))
            # A send retried after a lost answer may store a message twice (at-least-once
            # producers): every consumer must see exactly what the queues hold.
            code, status = server.admin_call("GET", f"/v1/topics/{topic}/status")
            assert code == 200, status
            stored = sum(q["max_offset"] - q["min_offset"] for q in status["queues"])
            assert stored >= 30
            await until(
                lambda: all(sum(c.offsets.values()) == stored for c in consumers),
                20,
                "every consumer pulling everything stored",
            )
            assert all(sorted(set(s)) == expected and len(s) == stored for s in seen)
        finally:
            await asyncio.gather(*(c.close() for c in consumers))

    run(scenario())
