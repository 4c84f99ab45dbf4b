"""Requeued deliveries: counted at once, and back in their place in the queue.

Queue.DeclareOk's and Basic.GetOk's message count is exact at once.

The count is what a consumer could be handed now, as RabbitMQ counts: never
delivered, or requeued (a nack or reject with requeue, a closed channel's unacked
deliveries). Unacked deliveries are not counted, nor is what an ack or a reject
without requeue settled, whichever order the client settles in. halfmoon's count is
right as soon as the settle before it is handled; RabbitMQ's requeue lands a moment
later (its queue process takes it), so pika's own tests (``TestBasicNack``,
``TestBasicReject``, ...) poll the count for up to 10 s: these do not poll.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel


@pytest.fixture
def connection(amqp_url: str) -> Iterator[pika.BlockingConnection]:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        yield conn
    finally:
        if conn.is_open:
            conn.close()


def queue_with(channel: BlockingChannel, *bodies: bytes) -> str:
    queue = f"count.{uuid.uuid4().hex[:8]}"
    channel.confirm_delivery()
    channel.queue_declare(queue, exclusive=True)
    for body in bodies:
        channel.basic_publish("", queue, body, mandatory=True)
    return queue


def count(channel: BlockingChannel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def get_all(channel: BlockingChannel, queue: str, n: int) -> list[int]:
    tags = []
    for _ in range(n):
        method, _, _ = channel.basic_get(queue)
        assert method is not None
        tags.append(method.delivery_tag)
    return tags


@pytest.mark.parametrize("settle", ["nack", "reject"])
def test_a_requeued_delivery_is_counted_at_once(
    connection: pika.BlockingConnection, settle: str
) -> None:
    ch = connection.channel()
    queue = queue_with(ch, b"one", b"two")
    _, second = get_all(ch, queue, 2)
    assert count(ch, queue) == 0
    if settle == "nack":
        ch.basic_nack(second, requeue=True)
    else:
        ch.basic_reject(second, requeue=True)
    assert count(ch, queue) == 1
    method, _, body = ch.basic_get(queue)
    assert method is not None and body == b"two" and method.redelivered
    assert method.message_count == 0


@pytest.mark.parametrize("settle", ["nack", "reject", "ack"])
def test_a_delivery_settled_above_an_unacked_one_is_not_counted(
    connection: pika.BlockingConnection, settle: str
) -> None:
    ch = connection.channel()
    queue = queue_with(ch, b"one", b"two", b"three")
    _, second = get_all(ch, queue, 2)
    if settle == "nack":
        ch.basic_nack(second, requeue=False)
    elif settle == "reject":
        ch.basic_reject(second, requeue=False)
    else:
        ch.basic_ack(second)
    # "one" is still unacked, "two" is gone, "three" was never delivered.
    assert count(ch, queue) == 1


def test_nack_multiple_requeues_every_delivery_up_to_the_tag(
    connection: pika.BlockingConnection,
) -> None:
    ch = connection.channel()
    queue = queue_with(ch, b"one", b"two", b"three")
    tags = get_all(ch, queue, 3)
    ch.basic_nack(tags[1], multiple=True, requeue=True)
    assert count(ch, queue) == 2
    method, _, body = ch.basic_get(queue, auto_ack=True)
    assert method is not None and body == b"one" and method.message_count == 1


def test_a_cancelled_consumers_unacked_deliveries_are_counted_once_its_channel_closes(
    connection: pika.BlockingConnection,
) -> None:
    ch = connection.channel()
    queue = queue_with(ch, b"one", b"two")
    delivered: list[int] = []
    tag = ch.basic_consume(queue, lambda c, m, p, b: delivered.append(m.delivery_tag))
    while len(delivered) < 2:
        connection.process_data_events(time_limit=0.1)
    assert count(ch, queue) == 0
    ch.basic_cancel(tag)
    # As in RabbitMQ, a cancelled consumer's deliveries stay the channel's to settle.
    assert count(ch, queue) == 0
    ch.close()
    assert count(connection.channel(), queue) == 2


def test_a_closed_channels_unacked_deliveries_are_counted_by_close_ok(
    connection: pika.BlockingConnection,
) -> None:
    ch = connection.channel()
    queue = queue_with(ch, b"one", b"two")
    get_all(ch, queue, 2)
    other = connection.channel()
    assert count(other, queue) == 0
    ch.close()
    assert count(other, queue) == 2


def test_deliveries_requeued_by_a_channel_closed_from_its_callback_keep_their_order(
    connection: pika.BlockingConnection,
) -> None:
    # pika's TestCloseChannelFromBasicConsumeCallback: closing the channel from the first
    # delivery's callback rejects (requeues) the second, which the client holds unseen, then
    # closes, which returns the first: RabbitMQ hands them out again first one first.
    ch = connection.channel()
    queue = queue_with(ch, b"one", b"two")
    seen: list[bytes] = []

    def on_message(channel: BlockingChannel, method, properties, body) -> None:  # type: ignore[no-untyped-def]
        seen.append(body)
        channel.close()

    ch.basic_consume(queue, on_message)
    ch.start_consuming()
    assert seen == [b"one"] and ch.is_closed
    ch = connection.channel()
    bodies = [ch.basic_get(queue, auto_ack=True)[2] for _ in range(2)]
    assert bodies == [b"one", b"two"]
