"""The relay's RabbitMQ target, unchanged, against halfmoon's AMQP endpoint (a real
``halfmoon serve``): every outbox row arrives exactly once, an unroutable one fails alone,
and a broker SIGKILLed under the relay loses no row it confirmed."""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from halfmoon.outbox import Outbox, OutboxMessage, RabbitTarget, Relay, UnroutableMessage
from tests.outbox.conftest import ServerProcess, wait_until
from tests.outbox.test_rabbit_target import record

MESSAGES = 1000


@pytest.fixture(scope="module")
def halfmoon_amqp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The AMQP URL of a ``halfmoon serve`` of this module's own."""
    proc = ServerProcess(
        tmp_path_factory.mktemp("halfmoon-amqp"),
        settings=("store.flush=sync", "server.amqp_listen=127.0.0.1:0"),
    ).start()
    try:
        assert proc.amqp_address, proc.log_tail()
        yield f"amqp://guest:guest@{proc.amqp_address}/"
    finally:
        if proc.alive():
            proc.stop()


async def declare(url: str, queue: str, exchange: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        q = await channel.declare_queue(queue, durable=True)
        x = await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)
        await q.bind(x, "order.#")


async def drain(url: str, queue: str, expected: int) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Every message of ``queue``: until ``expected`` came and then 1 s more, or 10 s of
    nothing."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=200)
        q = await channel.get_queue(queue)
        got: list[aio_pika.abc.AbstractIncomingMessage] = []
        async with q.iterator() as messages:
            while True:
                try:
                    message = await asyncio.wait_for(
                        messages.__anext__(), 1.0 if len(got) >= expected else 10.0
                    )
                except TimeoutError:
                    return got
                await message.ack()
                got.append(message)


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_relay_publishes_every_row_exactly_once_to_halfmoon(
    halfmoon_amqp: str, outbox: Outbox
) -> None:
    queue, exchange = f"relay-{uuid.uuid4().hex[:8]}", f"orders-{uuid.uuid4().hex[:8]}"
    asyncio.run(declare(halfmoon_amqp, queue, exchange))
    with outbox.engine.begin() as conn:
        ids = outbox.add_many(
            conn,
            [
                OutboxMessage(
                    # Half to the queue by the default exchange, half through a topic exchange.
                    exchange if i % 2 else "",
                    str(i).encode(),
                    routing_key=f"order.{i}" if i % 2 else queue,
                    aggregate_id=str(i % 50),
                    headers={"n": str(i)},
                )
                for i in range(MESSAGES)
            ],
        )
    relay = Relay(outbox, RabbitTarget(halfmoon_amqp), workers=2, batch_size=50, poll_interval=0.05)
    with relay:
        wait_until(lambda: outbox.status().pending == 0, 120, "the relay to publish every row")
    assert relay.stats().failed == 0
    got = asyncio.run(drain(halfmoon_amqp, queue, MESSAGES))
    counts = collections.Counter(m.message_id for m in got)
    assert set(counts) == set(ids), f"{len(set(ids) - set(counts))} published rows missing"
    assert max(counts.values()) == 1, "a row arrived twice"
    by_id = {m.message_id: m for m in got}
    first = by_id[ids[1]]
    assert first.body == b"1" and first.routing_key == "order.1" and first.exchange == exchange
    assert first.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert first.headers["n"] == "1" and first.headers["outbox_aggregate_id"] == "1"


def test_an_unroutable_row_fails_alone_on_halfmoon(halfmoon_amqp: str) -> None:
    queue, exchange = f"relay-{uuid.uuid4().hex[:8]}", f"orders-{uuid.uuid4().hex[:8]}"
    asyncio.run(declare(halfmoon_amqp, queue, exchange))
    records = [
        record(queue, b"a"),
        record(queue, b"lost", routing_key=f"nobody-{uuid.uuid4().hex}"),
        record(queue, b"c"),
    ]
    with RabbitTarget(halfmoon_amqp) as target:
        results = target.publish(records)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], UnroutableMessage)
    assert [m.body for m in asyncio.run(drain(halfmoon_amqp, queue, 2))] == [b"a", b"c"]


@pytest.mark.slow
def test_a_broker_killed_under_the_relay_loses_no_row(tmp_path: Path) -> None:
    """Rows confirmed before a SIGKILL are in the queue after the restart; the rest are
    published once the relay reconnects. A row whose confirm the kill cut off is published
    again (consumers dedupe on ``message_id``): at most the relay's in-flight batches."""
    server = ServerProcess(tmp_path / "data", settings=("store.flush=sync",)).start()
    url = f"amqp://guest:guest@{server.amqp_address}/"
    box = Outbox(f"sqlite:///{tmp_path / 'outbox.db'}")
    box.create_tables()
    try:
        queue, exchange = "relay-kill", "orders-kill"
        asyncio.run(declare(url, queue, exchange))
        with box.engine.begin() as conn:
            ids = box.add_many(
                conn,
                [
                    OutboxMessage("", str(i).encode(), routing_key=queue, aggregate_id=str(i % 50))
                    for i in range(2000)
                ],
            )
        workers, batch = 2, 50
        relay = Relay(
            box,
            RabbitTarget(url, confirm_timeout=5.0),
            workers=workers,
            batch_size=batch,
            poll_interval=0.05,
            backoff_initial=0.05,
            backoff_max=0.5,
        )
        with relay:
            wait_until(lambda: relay.stats().published >= 300, 60, "publishing to get going")
            server.kill()
            server.start()
            wait_until(lambda: box.status().pending == 0, 120, "the relay to publish every row")
        got = asyncio.run(drain(url, queue, len(ids)))
        counts = collections.Counter(m.message_id for m in got)
        assert set(ids) <= set(counts), f"{len(set(ids) - set(counts))} rows lost"
        assert set(counts) <= set(ids)
        again = sum(n - 1 for n in counts.values())
        assert again <= workers * batch, f"{again} rows published twice"
        print(f"\n{len(ids)} rows, {again} published again after the kill")
    finally:
        box.engine.dispose()
        server.kill()
