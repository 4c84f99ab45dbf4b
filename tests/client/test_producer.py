"""Producer against a real server: round trips, batches, FIFO order, typed errors, fault
tolerance."""

from __future__ import annotations

import asyncio

import pytest

from halfmoon.client import (
    LatencyFaultPolicy,
    LatencyFaultTolerance,
    Message,
    MessageBodyTooLarge,
    MessageSelector,
    MessageTypeMismatch,
    Producer,
    SimpleConsumer,
    TopicNotFound,
)
from halfmoon.client.batch import framed_size, split_batch
from halfmoon.client.message import message_ids, to_wire
from tests.client.conftest import ServerProcess, run, unique


async def drain(consumer: SimpleConsumer, count: int, timeout: float = 15.0) -> list:
    got: list = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(got) < count and loop.time() < deadline:
        batch = await consumer.receive(64, 30, wait=1.0)
        for message in batch:
            await consumer.ack(message)
        got.extend(batch)
    return got


def test_send_receive_round_trip_keeps_every_field(server: ServerProcess) -> None:
    topic, group = unique("rt"), unique("rt-g")
    server.create_topic(topic)
    server.create_group(group)

    async def scenario() -> None:
        async with (
            Producer(server.grpc, topics=[topic]) as producer,
            SimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer,
        ):
            receipt = await producer.send(
                Message(
                    topic,
                    b"hello",
                    tag="TagA",
                    keys=["order-1", "user-7"],
                    properties={"region": "eu"},
                )
            )
            assert len(receipt.message_id) == 34 and receipt.offset >= 0
            async_done: list = []
            task = producer.send_async(
                Message(topic, b"async"), callback=lambda r, e: async_done.append((r, e))
            )
            async_receipt = await task
            producer.send_oneway(Message(topic, b"oneway"))
            got = await drain(consumer, 3)
            by_body = {m.body: m for m in got}
            assert set(by_body) == {b"hello", b"async", b"oneway"}
            hello = by_body[b"hello"]
            assert (hello.message_id, hello.tag, hello.keys, hello.properties) == (
                receipt.message_id,
                "TagA",
                ["order-1", "user-7"],
                {"region": "eu"},
            )
            assert async_done == [(async_receipt, None)]

    run(scenario())


def test_batch_over_four_mebibytes_is_split_and_all_arrive(server: ServerProcess) -> None:
    topic, group = unique("batch"), unique("batch-g")
    server.create_topic(topic)
    server.create_group(group)
    body = b"b" * (300 * 1024)
    count = 30  # ~9 MiB in all: at least three requests

    async def scenario() -> None:
        async with (
            Producer(server.grpc, topics=[topic]) as producer,
            SimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer,
        ):
            before = producer.stats.requests
            receipts = await producer.send_batch(
                [Message(topic, body, keys=[f"k{i}"]) for i in range(count)]
            )
            assert len(receipts) == count and len({r.message_id for r in receipts}) == count
            assert producer.stats.requests - before >= 3
            got = await drain(consumer, count)
            assert sorted(m.keys[0] for m in got) == sorted(f"k{i}" for i in range(count))
            assert all(m.body == body for m in got)

    run(scenario())


def test_split_batch_keeps_order_and_limit() -> None:
    wires = [to_wire(Message("t", b"x" * n), message_ids.next()) for n in (10, 500, 300, 700, 5)]
    chunks = list(split_batch(wires, 1000))
    assert [w for c in chunks for w in c] == wires
    assert all(sum(framed_size(w) for w in c) <= 1000 for c in chunks)
    with pytest.raises(MessageBodyTooLarge):
        list(split_batch([to_wire(Message("t", b"x" * 2000), message_ids.next())], 1000))


def test_fifo_order_per_message_group(server: ServerProcess) -> None:
    topic, group = unique("fifo"), unique("fifo-g")
    server.create_topic(topic, message_type="fifo")
    server.create_group(group, fifo=True)

    async def scenario() -> None:
        async with (
            Producer(server.grpc, topics=[topic]) as producer,
            SimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer,
        ):
            for i in range(20):
                for order in ("A", "B", "C"):
                    await producer.send(
                        Message(topic, f"{order}-{i}".encode(), message_group=order)
                    )
            got = await drain(consumer, 60)
            for order in ("A", "B", "C"):
                seq = [int(m.body.split(b"-")[1]) for m in got if m.message_group == order]
                assert seq == list(range(20)), (order, seq)

    run(scenario())


def test_typed_errors(server: ServerProcess) -> None:
    topic = unique("typed")
    server.create_topic(topic)  # a NORMAL topic

    async def scenario() -> None:
        async with Producer(server.grpc) as producer:
            with pytest.raises(TopicNotFound) as missing:
                await producer.send(Message(unique("no-such-topic"), b"x"))
            assert missing.value.code == "TOPIC_NOT_FOUND"
            with pytest.raises(MessageTypeMismatch):
                await producer.send(Message(topic, b"x", message_group="g"))
            with pytest.raises(MessageBodyTooLarge):
                await producer.send(Message(topic, b"x" * (producer.max_body_size + 1)))

    run(scenario())


def test_latency_fault_table() -> None:
    now = [100.0]
    faults = LatencyFaultTolerance(LatencyFaultPolicy(), now=lambda: now[0])
    faults.record("slow", 0.6)
    assert not faults.available("slow")
    now[0] += 3.01
    assert faults.available("slow")
    faults.record("slower", 1.2)
    now[0] += 59
    assert not faults.available("slower")
    assert faults.pick(["slower", "ok"]) == "ok"
    faults.record("ok", 0.6)
    assert faults.pick(["slower", "ok"]) == "slower"  # both avoided: the one free soonest
    off = LatencyFaultTolerance(LatencyFaultPolicy(enabled=False))
    off.record("x", 5.0)
    assert off.available("x")
