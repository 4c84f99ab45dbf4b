"""A commit that got no answer can be retried: the retry reaches the broker and says what
became of the transaction (real ``halfmoon serve`` processes, SIGKILLed and SIGSTOPped)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from halfmoon.client import (
    ClientConfig,
    Message,
    MessageSelector,
    MessageView,
    SimpleConsumer,
    TransactionAlreadyEnded,
    TransactionIncomplete,
    TransactionOutcomeUnknown,
    TransactionProducer,
    TransactionRolledBack,
)
from tests.client.conftest import ServerProcess, run, unique

pytestmark = pytest.mark.slow

SETTINGS = ("store.flush=sync", "broker.min_receive_invisible_ms=1s")


def start_server(tmp_path: Path) -> ServerProcess:
    return ServerProcess(tmp_path / "data", settings=SETTINGS).start()


def prepare(server: ServerProcess) -> tuple[str, str, str, str]:
    source, sink, group, reader = unique("in"), unique("out"), unique("g"), unique("reader")
    server.create_topic(source, queues=1)
    server.create_topic(sink, message_type="transaction", queues=1)
    server.create_group(group)
    server.create_group(reader, consume_from="earliest")
    return source, sink, group, reader


async def receive(
    consumer: SimpleConsumer, want: int, *, ack: bool, within: float = 20.0
) -> list[MessageView]:
    """Up to ``want`` messages received within ``within`` seconds."""
    got: list[MessageView] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while len(got) < want and loop.time() < deadline:
        try:
            batch = await consumer.receive(32, 5, wait=0.5)
        except Exception:  # noqa: BLE001 - the server may still be coming back
            await asyncio.sleep(0.2)
            continue
        for message in batch:
            got.append(message)
            if ack:
                await consumer.ack(message)
    return got


def config(server: ServerProcess) -> ClientConfig:
    return ClientConfig(server.grpc, request_timeout=2.0)


def test_a_commit_the_broker_never_took_is_retried_after_its_restart(tmp_path: Path) -> None:
    """The broker dies before the commit: the commit says the outcome is unknown; the
    retry after the restart reaches the broker, which lost the registered ack, and answers
    that the group was rolled back; the input comes back, no output appears."""
    server = start_server(tmp_path)
    source, sink, group, reader = prepare(server)

    async def scenario() -> None:
        async with (
            TransactionProducer(config(server), unique("pg")) as producer,
            SimpleConsumer(config(server), group, {source: MessageSelector.all()}) as consumer,
        ):
            await producer.send(Message(source, b"input"))
            (message,) = await receive(consumer, 1, ack=False)
            tx = consumer.transaction(producer)
            await tx.send(Message(sink, b"output"))
            await tx.ack(message)
            assert server.proc is not None
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait(10)
            with pytest.raises(TransactionOutcomeUnknown) as unknown:
                await tx.commit()
            assert unknown.value.retryable
            server.start()
            retried = False
            for _ in range(50):  # until the client's channel is back
                try:
                    await tx.commit()
                except TransactionOutcomeUnknown:
                    await asyncio.sleep(0.2)
                    continue
                except TransactionIncomplete:
                    retried = True
                    break
            assert retried, "the retried commit never reached the broker"
            assert tx.outcome == "rolled back"
            await tx.rollback()  # already rolled back: nothing to do
            with pytest.raises(TransactionRolledBack):
                await tx.commit()
            again = await receive(consumer, 1, ack=True)
            assert [m.body for m in again] == [b"input"]  # nothing lost
        async with SimpleConsumer(server.grpc, reader, {sink: MessageSelector.all()}) as out:
            assert await receive(out, 1, ack=True, within=3) == []  # the output never appeared

    try:
        run(scenario(), timeout=120)
    finally:
        if server.alive():
            server.stop()


def test_a_commit_whose_answer_was_lost_retries_to_committed(tmp_path: Path) -> None:
    """The broker is frozen while the commit is in flight (SIGSTOP): the commit times out
    with the outcome unknown. Once the broker runs again the retry answers committed; a
    rollback then says the commit stands; the output appears once, the input never again."""
    server = start_server(tmp_path)
    source, sink, group, reader = prepare(server)

    async def scenario() -> None:
        async with (
            TransactionProducer(config(server), unique("pg")) as producer,
            SimpleConsumer(config(server), group, {source: MessageSelector.all()}) as consumer,
        ):
            await producer.send(Message(source, b"input"))
            (message,) = await receive(consumer, 1, ack=False)
            tx = consumer.transaction(producer)
            await tx.send(Message(sink, b"output"))
            await tx.ack(message)
            assert server.proc is not None
            server.proc.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(TransactionOutcomeUnknown):
                    await tx.commit()
            finally:
                server.proc.send_signal(signal.SIGCONT)
            await tx.commit()  # the real outcome: committed (now, or by the frozen call)
            assert tx.outcome == "committed"
            await tx.commit()  # repeated: still committed
            with pytest.raises(TransactionAlreadyEnded):
                await tx.rollback()
            # The ack was committed: past the delivery's 5 s invisible time nothing is back.
            assert await receive(consumer, 1, ack=True, within=6) == []
        async with SimpleConsumer(server.grpc, reader, {sink: MessageSelector.all()}) as out:
            outputs = await receive(out, 2, ack=True, within=3)
            assert [m.body for m in outputs] == [b"output"]

    try:
        run(scenario(), timeout=120)
    finally:
        if server.alive():
            server.stop()
