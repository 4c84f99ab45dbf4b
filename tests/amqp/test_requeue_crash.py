"""Deliveries unacked when ``halfmoon serve`` is SIGKILLed return to their queue at the restart.

A pika client takes messages (Basic.Get) and acks some, or an aio-pika consumer holds its
prefetch unacked; once the broker's consumption state holds
those deliveries (journaled, as it is every ``broker.offset_persist_interval_ms``) the
server is SIGKILLed and started again on the same data directory, with the default
consumer timeout (30 minutes). A new consumer gets the unacked ones at once, marked
redelivered, then the rest of the queue; the acked ones never again; nothing twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import aio_pika
import pika
import pytest

from halfmoon.amqp.names import namespace_of, stored_name
from halfmoon.broker.consumption import read_snapshot
from halfmoon.server.app import METADATA_DIR_NAME
from tests.amqp.test_tx_crash import connect
from tests.server.conftest import ServerProcess
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

MESSAGES = 20
TAKEN = 6  # delivered before the kill
ACKED = (0, 1, 3)  # of those, acked before it
RETURN_DEADLINE_S = 60.0  # generous for a loaded machine; the consumer timeout is 30 minutes


def in_flight(data_dir: Path, queue: str) -> set[int] | None:
    """The queue offsets of ``queue``'s group in flight in the consumption snapshot."""
    snapshot = read_snapshot(data_dir / METADATA_DIR_NAME / "consumption.json")
    stored = stored_name(namespace_of("/"), queue)
    for state in snapshot.topics if snapshot is not None else ():
        if state.group == stored and state.topic == stored:
            return {offset for q in state.queues.values() for offset in q.inflight}
    return None


def take(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str, count: int):
    got = []
    for method, _properties, body in channel.consume(queue, inactivity_timeout=30):
        assert method is not None, f"only {len(got)} of {count} deliveries arrived"
        got.append((method, body))
        if len(got) == count:
            break
    return got


def test_unacked_deliveries_come_back_at_once_after_a_kill_redelivered(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = ServerProcess(
        data_dir,
        settings=("store.flush=sync",),
    ).start()
    url = f"amqp://guest:guest@{server.amqp_address}/%2F"
    try:
        connection = connect(url)
        channel = connection.channel()
        channel.queue_declare("work", durable=True)
        channel.confirm_delivery()
        for i in range(MESSAGES):
            channel.basic_publish("", "work", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
        # Basic.Get: exactly these are delivered (a consumer would be sent more after acks).
        taken = [channel.basic_get("work") for _ in range(TAKEN)]
        assert [body for _m, _p, body in taken] == [b"m%d" % i for i in range(TAKEN)]
        for i in ACKED:
            channel.basic_ack(taken[i][0].delivery_tag)
        unacked = {i for i in range(TAKEN) if i not in ACKED}
        # The kill comes once the broker's state holds the acks and the deliveries in flight.
        wait_until(
            lambda: in_flight(data_dir, "work") == unacked,
            30,
            "the consumption state to hold the unacked deliveries",
        )
        server.kill()  # the consumer's connection dies with the server
        started = time.monotonic()
        server.start()

        connection = connect(url)
        channel = connection.channel()
        back = take(channel, "work", MESSAGES - len(ACKED))
        returned_in = time.monotonic() - started
        bodies = [body for _m, body in back]
        assert sorted(bodies) == sorted(b"m%d" % i for i in range(MESSAGES) if i not in ACKED), (
            "nothing lost, nothing twice, nothing acked again"
        )
        redelivered = {body for method, body in back if method.redelivered}
        assert redelivered == {b"m%d" % i for i in unacked}
        assert bodies[: len(unacked)] == [b"m%d" % i for i in sorted(unacked)]
        assert returned_in < RETURN_DEADLINE_S
        channel.basic_ack(back[-1][0].delivery_tag, multiple=True)
        connection.close()
    finally:
        server.kill()


def test_an_aio_pika_consumers_unacked_deliveries_come_back_after_a_kill(tmp_path: Path) -> None:
    """A consumer with prefetch 4 holds four deliveries, unacked, when the server dies; at the
    restart a new consumer gets those four first, redelivered, then the rest, once each."""
    data_dir = tmp_path / "data"
    server = ServerProcess(
        data_dir,
        settings=("store.flush=sync",),
    ).start()
    url = f"amqp://guest:guest@{server.amqp_address}/%2F"
    prefetch = 4

    async def hold(held: asyncio.Event) -> aio_pika.abc.AbstractConnection:
        connection = await aio_pika.connect(url, timeout=10)
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue("held", durable=True)
        for i in range(MESSAGES):
            await channel.default_exchange.publish(
                aio_pika.Message(b"m%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key="held",
            )
        await channel.set_qos(prefetch_count=prefetch)
        got: list[aio_pika.abc.AbstractIncomingMessage] = []

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.append(message)  # never acked
            if len(got) == prefetch:
                held.set()

        await queue.consume(on_message)
        await asyncio.wait_for(held.wait(), 30)
        assert [m.body for m in got] == [b"m%d" % i for i in range(prefetch)]
        return connection

    async def take_all() -> list[tuple[bytes, bool]]:
        connection = await aio_pika.connect(url, timeout=10)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("held", durable=True)
            out: list[tuple[bytes, bool]] = []
            async with queue.iterator() as messages:
                async for message in messages:
                    await message.ack()
                    out.append((message.body, message.redelivered))
                    if len(out) == MESSAGES:
                        break
            return out

    loop = asyncio.new_event_loop()
    try:
        holder = loop.run_until_complete(hold(asyncio.Event()))
        wait_until(
            lambda: in_flight(data_dir, "held") == set(range(prefetch)),
            30,
            "the consumption state to hold the consumer's deliveries",
        )
        server.kill()
        server.start()
        got = loop.run_until_complete(asyncio.wait_for(take_all(), RETURN_DEADLINE_S))
        with contextlib.suppress(Exception):
            loop.run_until_complete(holder.close())
    finally:
        loop.close()
        server.kill()
    assert [body for body, _ in got] == [b"m%d" % i for i in range(MESSAGES)]
    assert [redelivered for _, redelivered in got] == [True] * prefetch + [False] * (
        MESSAGES - prefetch
    )


def test_deliveries_made_just_before_a_kill_come_back_redelivered(tmp_path: Path) -> None:
    """No wait for a snapshot: each receive is journaled before the delivery goes out, so the
    restart knows the ones made in the last moment too, and marks them redelivered."""
    server = ServerProcess(
        tmp_path / "data",
    ).start()
    url = f"amqp://guest:guest@{server.amqp_address}/%2F"
    try:
        connection = connect(url)
        channel = connection.channel()
        channel.queue_declare("late", durable=True)
        channel.confirm_delivery()
        for i in range(MESSAGES):
            channel.basic_publish("", "late", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
        for _ in range(TAKEN):
            assert channel.basic_get("late")[0] is not None
        server.kill()
        server.start()
        channel = connect(url).channel()
        back = take(channel, "late", MESSAGES)
        assert [(body, method.redelivered) for method, body in back] == [
            (b"m%d" % i, i < TAKEN) for i in range(MESSAGES)
        ]
    finally:
        server.kill()
