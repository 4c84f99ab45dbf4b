"""Send coalescing against a real server: shared requests, own receipts, isolated errors, FIFO
order, close."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from halfmoon.client import (
    BadRequest,
    Message,
    MessageBodyTooLarge,
    MessageSelector,
    MessageTypeMismatch,
    Producer,
    SimpleConsumer,
)
from halfmoon.client.message import MessageView
from tests.client.conftest import ServerProcess, run, unique


async def drain(consumer: SimpleConsumer, count: int, timeout: float = 20.0) -> list[MessageView]:
    got: list[MessageView] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(got) < count and loop.time() < deadline:
        batch = await consumer.receive(32, 30, wait=1.0)
        for message in batch:
            await consumer.ack(message)
        got.extend(batch)
    return got


def test_concurrent_sends_share_one_request_and_each_gets_its_own_receipt(
    server: ServerProcess,
) -> None:
    topic, group = unique("co"), unique("co-g")
    server.create_topic(topic)
    server.create_group(group)
    count = 32

    def message(i: int) -> Message:
        # Mixed tags, keys and properties in one request: each must be stored with its own.
        return Message(
            topic,
            f"body-{i}".encode() * (i + 1),
            tag=f"T{i % 3}",
            keys=[f"k{i}", f"k{i}-b"],
            properties={"i": str(i)},
        )

    async def scenario() -> None:
        async with (
            Producer(server.grpc, topics=[topic]) as producer,
            SimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer,
        ):
            before = producer.stats.requests
            receipts = await asyncio.gather(*(producer.send(message(i)) for i in range(count)))
            # gather starts every send before the first request leaves: one request for all.
            assert producer.stats.requests - before == 1
            assert producer.coalescing is not None and producer.coalescing.largest == count
            assert len({r.message_id for r in receipts}) == count
            got = {m.message_id: m for m in await drain(consumer, count)}
            assert len(got) == count
            for i, receipt in enumerate(receipts):
                stored = got[receipt.message_id]
                sent = message(i)
                assert stored.body == sent.body, i
                assert stored.queue_offset == receipt.offset, i
                assert (stored.tag, stored.keys, stored.properties) == (
                    sent.tag,
                    sent.keys,
                    sent.properties,
                ), i

    run(scenario())


def test_sixteen_awaiting_senders_use_fewer_requests_than_messages(server: ServerProcess) -> None:
    topic = unique("co16")
    server.create_topic(topic)
    per_sender = 20

    async def scenario() -> None:
        async with Producer(server.grpc, topics=[topic]) as producer:

            async def sender(n: int) -> list[str]:
                return [
                    (await producer.send(Message(topic, f"{n}-{i}".encode()))).message_id
                    for i in range(per_sender)
                ]

            ids = await asyncio.gather(*(sender(n) for n in range(16)))
            assert len({i for chunk in ids for i in chunk}) == 16 * per_sender
            assert producer.stats.messages == 16 * per_sender
            # Each answer releases the sends queued behind it together.
            assert producer.stats.requests <= producer.stats.messages // 4, (
                producer.stats,
                producer.coalescing,
            )

    run(scenario())


def test_lone_sends_go_out_at_once_one_request_each(server: ServerProcess) -> None:
    topic = unique("lone")
    server.create_topic(topic)

    async def scenario() -> None:
        async with Producer(server.grpc, topics=[topic]) as producer:
            assert producer.coalescing is not None
            task = producer.send_async(Message(topic, b"alone"))
            # No timer: the request starts within a few loop steps, before any answer can be
            # awaited.
            for _ in range(5):
                await asyncio.sleep(0)
            assert producer.coalescing.requests == 1
            await task
            for i in range(4):
                await producer.send(Message(topic, f"seq-{i}".encode()))
            assert producer.stats.requests == 5 and producer.stats.messages == 5
            assert producer.coalescing.largest == 1

    run(scenario())


def test_one_bad_message_fails_only_its_own_caller(server: ServerProcess) -> None:
    topic, group = unique("iso"), unique("iso-g")
    server.create_topic(topic)  # NORMAL: a FIFO message is refused by the client's type check
    server.create_group(group)

    async def scenario() -> None:
        async with (
            Producer(server.grpc, topics=[topic]) as producer,
            SimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer,
        ):
            messages = [Message(topic, f"good-{i}".encode()) for i in range(10)]
            messages[3] = Message(topic, b"bad-tag", tag="a|b")  # refused by the server
            messages[7] = Message(topic, b"bad-type", message_group="g")  # refused by the client
            results = await asyncio.gather(
                *(producer.send(m) for m in messages), return_exceptions=True
            )
            assert isinstance(results[3], BadRequest) and results[3].code == "ILLEGAL_MESSAGE_TAG"
            assert isinstance(results[7], MessageTypeMismatch)
            good = [r for i, r in enumerate(results) if i not in (3, 7)]
            assert all(not isinstance(r, BaseException) for r in good), results
            got = await drain(consumer, 8)
            assert sorted(m.body for m in got) == sorted(
                f"good-{i}".encode() for i in range(10) if i not in (3, 7)
            )
            assert producer.coalescing is not None and producer.coalescing.isolated >= 10

    run(scenario())


def test_oversize_body_among_good_ones_fails_alone(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server = server_factory(settings=("broker.max_body_size=65536",)).start()
    topic, group = unique("big"), unique("big-g")
    server.create_topic(topic)
    server.create_group(group)

    async def scenario() -> None:
        async with (
            Producer(server.grpc, topics=[topic]) as producer,
            SimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer,
        ):
            assert producer.max_body_size == 65536  # learned from the server
            producer.max_body_size = (
                1 << 20
            )  # a stale view (limit lowered at runtime): the server must refuse
            messages = [Message(topic, f"ok-{i}".encode()) for i in range(6)]
            messages.insert(2, Message(topic, b"x" * 100_000))
            results = await asyncio.gather(
                *(producer.send(m) for m in messages), return_exceptions=True
            )
            assert isinstance(results[2], MessageBodyTooLarge), results[2]
            assert [r for r in results if isinstance(r, BaseException)] == [results[2]]
            got = await drain(consumer, 6)
            assert sorted(m.body for m in got) == sorted(f"ok-{i}".encode() for i in range(6))

    run(scenario())


def test_fifo_order_per_message_group_under_concurrency(server: ServerProcess) -> None:
    topic, group = unique("cofifo"), unique("cofifo-g")
    server.create_topic(topic, message_type="fifo")
    server.create_group(group, fifo=True)
    groups, per_group = ["A", "B", "C", "D", "E", "F"], 25

    async def scenario() -> None:
        async with (
            Producer(server.grpc, topics=[topic]) as producer,
            SimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer,
        ):
            # One awaiting sender per group (order = its send order), plus fire-and-forget
            # sends whose order is the order of the send_async calls.
            async def sender(name: str) -> None:
                for i in range(per_group):
                    await producer.send(Message(topic, f"{name}-{i}".encode(), message_group=name))

            tasks = [
                producer.send_async(Message(topic, f"Z-{i}".encode(), message_group="Z"))
                for i in range(per_group)
            ]
            await asyncio.gather(*(sender(g) for g in groups), *tasks)
            assert producer.stats.requests < producer.stats.messages
            total = (len(groups) + 1) * per_group
            got = await drain(consumer, total, timeout=30.0)
            assert len(got) == total
            for name in [*groups, "Z"]:
                seq = [int(m.body.split(b"-")[1]) for m in got if m.message_group == name]
                assert seq == list(range(per_group)), (name, seq)

    run(scenario())


def test_close_flushes_queued_and_inflight_sends(server: ServerProcess) -> None:
    topic, group = unique("flush"), unique("flush-g")
    server.create_topic(topic)
    server.create_group(group)
    count = 40

    async def scenario() -> None:
        async with SimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer:
            producer = Producer(server.grpc, topics=[topic])
            await producer.start()
            for i in range(count):
                producer.send_oneway(Message(topic, f"one-{i}".encode()))
            tasks = [
                producer.send_async(Message(topic, f"async-{i}".encode())) for i in range(count)
            ]
            await producer.close()  # nothing has been awaited yet: close must send it all
            assert all(t.done() and t.exception() is None for t in tasks)
            got = await drain(consumer, 2 * count)
            assert len({m.body for m in got}) == 2 * count

    run(scenario())


def test_coalesce_false_sends_one_request_per_message(server: ServerProcess) -> None:
    topic = unique("nocoal")
    server.create_topic(topic)

    async def scenario() -> None:
        async with Producer(server.grpc, topics=[topic], coalesce=False) as producer:
            assert producer.coalescing is None
            receipts = await asyncio.gather(
                *(producer.send(Message(topic, f"m{i}".encode())) for i in range(12))
            )
            assert len({r.message_id for r in receipts}) == 12
            assert producer.stats.requests == producer.stats.messages == 12

    run(scenario())
