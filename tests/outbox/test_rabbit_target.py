"""The RabbitMQ target against a real RabbitMQ: confirms, returns, a connection closed by the
server."""

from __future__ import annotations

import asyncio
import re
import subprocess
import uuid
from pathlib import Path

import aio_pika
import pytest

from halfmoon.outbox import (
    Outbox,
    OutboxMessage,
    OutboxRecord,
    RabbitTarget,
    Relay,
    UnroutableMessage,
)
from tests.outbox.conftest import wait_until


def record(queue: str, body: bytes, routing_key: str | None = None) -> OutboxRecord:
    return OutboxRecord(
        id=0,
        message_id=uuid.uuid4().hex,
        aggregate_type="order",
        aggregate_id="1",
        topic="",
        routing_key=routing_key or queue,
        keys=[],
        tag="created",
        message_group=None,
        headers={"trace": "t1"},
        payload=body,
        attempts=0,
        created_at=0,
    )


class Queue:
    """A durable queue of the test's own, read with a separate connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.name = f"hm-test-{uuid.uuid4().hex[:10]}"
        asyncio.run(self._run(lambda ch: ch.declare_queue(self.name, durable=True)))

    async def _run(self, action):  # noqa: ANN001, ANN202
        connection = await aio_pika.connect(self.url)
        try:
            channel = await connection.channel()
            return await action(channel)
        finally:
            await connection.close()

    def drain(self) -> list[aio_pika.abc.AbstractIncomingMessage]:
        async def get_all(channel):  # noqa: ANN001, ANN202
            queue = await channel.get_queue(self.name)
            got = []
            while (message := await queue.get(fail=False, no_ack=True)) is not None:
                got.append(message)
            return got

        return asyncio.run(self._run(get_all))

    def delete(self) -> None:
        asyncio.run(self._run(lambda ch: ch.queue_delete(self.name)))


@pytest.fixture
def queue(amqp_url: str):  # noqa: ANN201
    q = Queue(amqp_url)
    yield q
    q.delete()


def test_publishes_persistent_confirmed_messages(amqp_url: str, queue: Queue) -> None:
    records = [record(queue.name, f"m{i}".encode()) for i in range(20)]
    with RabbitTarget(amqp_url) as target:
        assert target.publish(records) == [None] * 20
    got = queue.drain()
    assert [m.message_id for m in got] == [r.message_id for r in records]
    first = got[0]
    assert (
        first.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        and first.body == b"m0"
        and first.type == "created"
    )
    assert first.headers["trace"] == "t1" and first.headers["outbox_aggregate_id"] == "1"


def test_an_unroutable_message_fails_alone(amqp_url: str, queue: Queue) -> None:
    records = [
        record(queue.name, b"a"),
        record(queue.name, b"lost", routing_key=f"nobody-{uuid.uuid4().hex}"),
        record(queue.name, b"c"),
    ]
    with RabbitTarget(amqp_url) as target:
        results = target.publish(records)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], UnroutableMessage)
    assert [m.body for m in queue.drain()] == [b"a", b"c"]


def close_connection(name: str) -> bool:
    """Close the connection named ``name`` from the server side (rabbitmqctl)."""
    listing = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "pid", "client_properties"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    for line in listing.stdout.splitlines():
        if f'{{"connection_name","{name}"}}' in line:
            pid = re.match(r"(<[^>]+>)", line.strip())
            if pid:
                done = subprocess.run(
                    ["rabbitmqctl", "-q", "close_connection", pid.group(1), "closed by test"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                return done.returncode == 0
    return False


@pytest.fixture
def sqlite_outbox(tmp_path: Path):  # noqa: ANN201
    """The RabbitMQ side is what is tested here: one database (SQLite) is enough."""
    box = Outbox(f"sqlite:///{tmp_path / 'outbox.db'}")
    box.create_tables()
    yield box
    box.engine.dispose()


def test_connection_closed_by_the_server_while_publishing(
    amqp_url: str, queue: Queue, sqlite_outbox: Outbox
) -> None:
    outbox = sqlite_outbox
    name = f"hm-relay-{uuid.uuid4().hex[:8]}"
    target = RabbitTarget(amqp_url, connection_name=name)

    def add(start: int, count: int) -> list[str]:
        with outbox.engine.begin() as conn:
            return outbox.add_many(
                conn,
                [
                    OutboxMessage(
                        "", str(i).encode(), routing_key=queue.name, aggregate_id=str(i % 50)
                    )
                    for i in range(start, start + count)
                ],
            )

    ids = add(0, 3000)
    relay = Relay(
        outbox,
        target,
        workers=2,
        batch_size=50,
        poll_interval=0.05,
        backoff_initial=0.05,
        backoff_max=0.2,
    )
    with relay:
        wait_until(lambda: relay.stats().published >= 200, 30, "publishing to get going")
        assert close_connection(name), "could not find the relay's connection to close"
        # Rows added after the close can only go out over a reopened connection,
        # however fast the first part was published.
        ids += add(3000, 500)
        wait_until(
            lambda: outbox.status().pending == 0,
            60,
            "the relay to publish everything after the drop",
        )
    assert target.reconnects >= 1
    assert relay.stats().failed == 0
    got = {m.message_id for m in queue.drain()}
    assert got == set(ids), f"{len(set(ids) - got)} confirmed messages missing from the queue"
