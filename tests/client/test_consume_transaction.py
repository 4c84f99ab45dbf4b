"""Consume-transform-produce transactions through halfmoon's client against a real server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from halfmoon.client import (
    InvalidReceiptHandle,
    Message,
    MessageSelector,
    MessageView,
    PullConsumer,
    SimpleConsumer,
    SyncSimpleConsumer,
    SyncTransactionProducer,
    TopicNotFound,
    TransactionFenced,
    TransactionProducer,
)
from tests.client.conftest import ServerProcess, run, unique

INVISIBLE = 2.0  # seconds: the server below lets receives hide messages this briefly


@pytest.fixture(scope="module")
def tx_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path_factory.mktemp("halfmoon-tx-consume"),
        settings=("broker.min_receive_invisible_ms=1s", "store.flush=sync"),
    ).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


def topics(server: ServerProcess, queues: int = 2) -> tuple[str, str, str]:
    source, sink, group = unique("ctp-in"), unique("ctp-out"), unique("ctp-g")
    server.create_topic(source, queues=queues)
    server.create_topic(sink, message_type="transaction", queues=queues)
    server.create_group(group, max_delivery_attempts=5)
    return source, sink, group


async def drain(consumer: SimpleConsumer, want: int, wait: float = 10.0) -> list[MessageView]:
    got: list[MessageView] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while len(got) < want and loop.time() < deadline:
        for message in await consumer.receive(32, 20, wait=0.5):
            got.append(message)
            await consumer.ack(message)
    return got


def test_commit_acks_and_publishes_together(tx_server: ServerProcess) -> None:
    source, sink, group = topics(tx_server)
    reader = unique("reader")
    tx_server.create_group(reader)

    async def scenario() -> None:
        async with (
            TransactionProducer(tx_server.grpc, unique("pg")) as producer,
            SimpleConsumer(tx_server.grpc, group, {source: MessageSelector.all()}) as consumer,
            SimpleConsumer(tx_server.grpc, reader, {sink: MessageSelector.all()}) as out,
        ):
            for i in range(5):
                await producer.send(Message(source, f"m{i}".encode()))
            received = await eventually_receive(consumer, 5)
            async with consumer.transaction(producer) as tx:
                for message in received:
                    await tx.send(Message(sink, message.body.upper()))
                    await tx.ack(message)
                assert await out.receive(8, 20, wait=0.3) == []  # nothing before the commit
            outputs = await drain(out, 5)
            assert sorted(m.body for m in outputs) == [f"M{i}".encode() for i in range(5)]
            await asyncio.sleep(INVISIBLE + 0.5)  # past the invisible time: nothing comes back
            assert await consumer.receive(8, INVISIBLE, wait=0.5) == []

    run(scenario())


async def eventually_receive(consumer: SimpleConsumer, want: int) -> list[MessageView]:
    got: list[MessageView] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while len(got) < want and loop.time() < deadline:
        got += await consumer.receive(want - len(got), INVISIBLE, wait=0.5)
    assert len(got) == want, got
    return got


def test_an_exception_rolls_back_and_the_message_returns_with_its_attempt(
    tx_server: ServerProcess,
) -> None:
    source, sink, group = topics(tx_server)

    async def scenario() -> None:
        async with (
            TransactionProducer(tx_server.grpc, unique("pg")) as producer,
            SimpleConsumer(tx_server.grpc, group, {source: MessageSelector.all()}) as consumer,
        ):
            await producer.send(Message(source, b"once"))
            (message,) = await eventually_receive(consumer, 1)
            with pytest.raises(RuntimeError):
                async with consumer.transaction(producer) as tx:
                    await tx.send(Message(sink, b"never"))
                    await tx.ack(message)
                    raise RuntimeError("transform failed")
            (again,) = await eventually_receive(consumer, 1)
            assert again.body == b"once" and again.delivery_attempt == 2
            reader = unique("reader")
            tx_server.create_group(reader)
            async with SimpleConsumer(tx_server.grpc, reader, {sink: MessageSelector.all()}) as out:
                assert await out.receive(8, 20, wait=0.5) == []

    run(scenario())


def test_zombie_consumer_is_fenced_and_the_other_commits(tx_server: ServerProcess) -> None:
    source, sink, group = topics(tx_server, queues=1)

    async def scenario() -> None:
        async with (
            TransactionProducer(tx_server.grpc, unique("pg")) as producer,
            SimpleConsumer(tx_server.grpc, group, {source: MessageSelector.all()}) as slow,
            SimpleConsumer(tx_server.grpc, group, {source: MessageSelector.all()}) as fast,
        ):
            await producer.send(Message(source, b"job"))
            (stale,) = await eventually_receive(slow, 1)
            zombie = slow.transaction(producer)
            await zombie.send(Message(sink, b"zombie-output"))
            await zombie.ack(stale)
            (fresh,) = await eventually_receive(fast, 1)  # after the invisible time
            assert fresh.delivery_attempt == 2
            async with fast.transaction(producer) as tx:
                await tx.send(Message(sink, b"fresh-output"))
                await tx.ack(fresh)
            with pytest.raises(TransactionFenced) as fenced:
                await zombie.commit()
            assert fenced.value.code == "TRANSACTION_FENCED"
            reader = unique("reader")
            tx_server.create_group(reader)
            async with SimpleConsumer(tx_server.grpc, reader, {sink: MessageSelector.all()}) as out:
                outputs = await drain(out, 1, wait=3)
            assert [m.body for m in outputs] == [b"fresh-output"]  # no duplicate output

    run(scenario())


def test_errors_show_at_the_call_not_at_commit(tx_server: ServerProcess) -> None:
    source, _sink, group = topics(tx_server)

    async def scenario() -> None:
        async with (
            TransactionProducer(tx_server.grpc, unique("pg")) as producer,
            SimpleConsumer(tx_server.grpc, group, {source: MessageSelector.all()}) as consumer,
        ):
            await producer.send(Message(source, b"x"))
            (message,) = await eventually_receive(consumer, 1)
            tx = consumer.transaction(producer)
            with pytest.raises(TopicNotFound):
                await tx.send(Message(unique("no-such-topic"), b"x"))
            handle = message.receipt_handle
            message.receipt_handle = handle[:-4] + ("AAAA" if handle[-4:] != "AAAA" else "BBBB")
            with pytest.raises(InvalidReceiptHandle):
                await tx.ack(message)
            message.receipt_handle = handle
            await tx.ack(message)
            await tx.commit()

    run(scenario())


def test_reject_to_dead_letter_on_commit_only(tx_server: ServerProcess) -> None:
    source, _sink, group = topics(tx_server, queues=1)

    async def scenario() -> None:
        async with (
            TransactionProducer(tx_server.grpc, unique("pg")) as producer,
            SimpleConsumer(tx_server.grpc, group, {source: MessageSelector.all()}) as consumer,
        ):
            await producer.send(Message(source, b"poison"))
            (message,) = await eventually_receive(consumer, 1)
            async with consumer.transaction() as tx:
                await tx.reject(message, dead_letter=True)
            reader = unique("dlq-reader")
            tx_server.create_group(reader)
            dlq = f"%DLQ%{group}"
            async with SimpleConsumer(tx_server.grpc, reader, {dlq: MessageSelector.all()}) as out:
                (dead,) = await drain(out, 1, wait=5)
            assert dead.body == b"poison"

    run(scenario())


def test_pull_consumer_offsets_commit_in_the_transaction_and_fence(
    tx_server: ServerProcess,
) -> None:
    source, sink, group = topics(tx_server, queues=1)

    async def scenario() -> None:
        async with TransactionProducer(tx_server.grpc, unique("pg")) as producer:
            for i in range(6):
                await producer.send(Message(source, f"p{i}".encode()))
            async with (
                PullConsumer(
                    tx_server.grpc, group, auto_commit=False, consume_from="earliest"
                ) as first,
                PullConsumer(
                    tx_server.grpc, group, auto_commit=False, consume_from="earliest"
                ) as second,
            ):
                (queue,) = await first.fetch_queues(source)
                await first.assign([queue])
                await second.assign([queue])
                read_by_first = await first.poll(2)
                read_by_second = await second.poll(2)
                assert read_by_first and read_by_second
                async with second.transaction(producer) as tx:
                    for m in read_by_second:
                        await tx.send(Message(sink, m.body))
                    await tx.commit_offsets()
                assert await first.committed(queue) == second.position(queue)
                zombie = first.transaction(producer)
                await zombie.send(Message(sink, b"dup"))
                await zombie.commit_offsets()
                with pytest.raises(TransactionFenced):
                    await zombie.commit()
                # The fenced member reads again from the committed offset.
                assert first.position(queue) == await first.committed(queue)

    run(scenario())


def test_sync_facade(tx_server: ServerProcess) -> None:
    source, sink, group = topics(tx_server)
    with (
        SyncTransactionProducer(tx_server.grpc, unique("pg")) as producer,
        SyncSimpleConsumer(tx_server.grpc, group, {source: MessageSelector.all()}) as consumer,
    ):
        producer.send(Message(source, b"sync"))
        received: list[MessageView] = []
        for _ in range(20):
            received += consumer.receive(1, INVISIBLE, wait=0.5)
            if received:
                break
        (message,) = received
        with pytest.raises(RuntimeError), consumer.transaction(producer) as tx:
            tx.send(Message(sink, b"ROLLED-BACK"))
            tx.ack(message)
            raise RuntimeError("rolls back")
        with consumer.transaction(producer) as tx:
            tx.send(Message(sink, b"SYNC"))
            tx.ack(message)  # expired meanwhile? then it is still this consumer's: not taken
    reader = unique("reader")
    tx_server.create_group(reader)

    async def outputs() -> list[bytes]:
        async with SimpleConsumer(tx_server.grpc, reader, {sink: MessageSelector.all()}) as out:
            return [m.body for m in await drain(out, 1, wait=3)]

    assert run(outputs()) == [b"SYNC"]
