"""A publish routed to many queues is stored once: every queue gets the message, the commit
log grows by about one record, not one per queue (pika and aio-pika)."""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from bench.commitlog_size import commit_log_end
from tests.server.conftest import ServerProcess
from tests.waiting import wait_until

QUEUES = 10
BODY = b"fan-" * 1024  # 4 KiB: the record's fixed part is small beside it
MESSAGES = 20


def name(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


@pytest.fixture
def channel(amqp_url: str):
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = connection.channel()
    ch.confirm_delivery()
    yield ch
    if connection.is_open:
        connection.close()


def _publish(ch: BlockingChannel, exchange: str, routing_key: str, i: int) -> None:
    ch.basic_publish(
        exchange,
        routing_key,
        BODY,
        pika.BasicProperties(delivery_mode=2, headers={"i": i}, message_id=f"m{i}"),
    )


def test_fanout_to_ten_queues_stores_the_message_once(
    channel: BlockingChannel, amqp_server: ServerProcess
) -> None:
    exchange = name("fan")
    channel.exchange_declare(exchange, "fanout", durable=True)
    queues = [name(f"fq{i}") for i in range(QUEUES)]
    for queue in queues:
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, exchange)
    single = name("single")
    channel.queue_declare(single, durable=True)

    # One queue first: the record a message takes when it goes to one queue.
    before = commit_log_end(amqp_server.data_dir)
    for i in range(MESSAGES):
        _publish(channel, "", single, i)
    record = (commit_log_end(amqp_server.data_dir) - before) / MESSAGES

    before = commit_log_end(amqp_server.data_dir)
    for i in range(MESSAGES):
        _publish(channel, exchange, "", i)  # confirmed: durable before it returns
    per_message = (commit_log_end(amqp_server.data_dir) - before) / MESSAGES
    print(f"fanout to {QUEUES}: {per_message:.0f} B per message, one-queue record {record:.0f} B")

    assert record >= len(BODY)
    # The destination list adds ~40 bytes a queue; ten records would be 10×.
    assert per_message <= 1.2 * record, (per_message, record)

    for queue in queues:
        got = []
        for _ in range(MESSAGES):
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            assert method is not None, f"{queue} has only {len(got)} messages"
            assert body == BODY
            got.append((properties.message_id, properties.headers["i"]))
        assert got == [(f"m{i}", i) for i in range(MESSAGES)]
        assert channel.basic_get(queue)[0] is None


def test_an_ack_in_one_queue_leaves_the_message_in_the_others(channel: BlockingChannel) -> None:
    exchange = name("fan")
    channel.exchange_declare(exchange, "fanout")
    queues = [name(f"fq{i}") for i in range(3)]
    for queue in queues:
        channel.queue_declare(queue)
        channel.queue_bind(queue, exchange)
    _publish(channel, exchange, "", 1)
    method, _, _ = channel.basic_get(queues[0])
    channel.basic_ack(method.delivery_tag)
    method, _, _ = channel.basic_get(queues[1])
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, _, body = channel.basic_get(queues[2], auto_ack=True)
    assert method is not None and not method.redelivered and body == BODY
    # The nack's requeue is not answered: poll for the message to come back.
    again = wait_until(
        lambda: channel.basic_get(queues[1], auto_ack=True)[0], 30, "the requeued message"
    )
    assert again.redelivered
    assert channel.basic_get(queues[0])[0] is None  # acked there, and only there


def test_queues_with_their_own_ttl_still_each_get_the_message(channel: BlockingChannel) -> None:
    """A queue's x-message-ttl gives its copy its own deadline: stored apart from the rest."""
    exchange = name("fan")
    channel.exchange_declare(exchange, "fanout")
    plain = [name("plain") for _ in range(3)]
    timed = name("timed")
    for queue in plain:
        channel.queue_declare(queue)
        channel.queue_bind(queue, exchange)
    channel.queue_declare(timed, arguments={"x-message-ttl": 600_000})
    channel.queue_bind(timed, exchange)
    _publish(channel, exchange, "", 7)
    for queue in [*plain, timed]:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        assert method is not None and body == BODY and properties.headers == {"i": 7}


def test_aio_pika_consumers_of_a_fanout_each_get_every_message(
    amqp_url: str, amqp_server: ServerProcess
) -> None:
    async def main() -> None:
        connection = await aio_pika.connect(amqp_url, timeout=10)
        async with connection:
            ch = await connection.channel(publisher_confirms=True)
            exchange = await ch.declare_exchange(
                name("afan"), aio_pika.ExchangeType.FANOUT, durable=True
            )
            queues = [await ch.declare_queue(name(f"aq{i}"), durable=True) for i in range(QUEUES)]
            for queue in queues:
                await queue.bind(exchange)
            before = commit_log_end(amqp_server.data_dir)
            await asyncio.gather(
                *(
                    exchange.publish(
                        aio_pika.Message(
                            BODY + b"%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                        ),
                        routing_key="",
                    )
                    for i in range(MESSAGES)
                )
            )
            grown = commit_log_end(amqp_server.data_dir) - before
            assert grown < 2 * MESSAGES * (len(BODY) + 1024)  # one record each, not ten
            for queue in queues:
                bodies = set()
                async with queue.iterator() as messages:
                    async for message in messages:
                        async with message.process():
                            bodies.add(message.body)
                        if len(bodies) == MESSAGES:
                            break
                assert bodies == {BODY + b"%d" % i for i in range(MESSAGES)}

    asyncio.run(asyncio.wait_for(main(), 60))
