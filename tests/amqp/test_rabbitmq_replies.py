"""Where the spec leaves the reply open and clients' own tests check RabbitMQ's: a
redeclare that differs in exclusivity (405), the default exchange declared (403),
and channel numbers (channel_max counts open channels; any number may be used)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pika
import pika.exceptions
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


def refused(channel: BlockingChannel, action: Callable[[BlockingChannel], object]) -> int:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        action(channel)
    return info.value.reply_code


@pytest.mark.parametrize(("first", "again"), [(True, False), (False, True)])
def test_a_redeclare_that_differs_in_exclusivity_is_405_even_on_its_own_connection(
    connection: pika.BlockingConnection, first: bool, again: bool
) -> None:
    # aiormq's test_exclusive_queue_locked declares its exclusive queue again, not
    # exclusively, from a second channel of the same connection.
    queue = f"excl.{uuid.uuid4().hex[:8]}"
    connection.channel().queue_declare(queue, exclusive=first, auto_delete=True)
    code = refused(connection.channel(), lambda ch: ch.queue_declare(queue, exclusive=again))
    assert code == 405
    assert connection.channel().queue_declare(queue, exclusive=first, auto_delete=True)


@pytest.mark.parametrize(
    "action",
    [
        lambda ch: ch.exchange_declare("", passive=True),
        lambda ch: ch.exchange_declare("", exchange_type="direct"),
        lambda ch: ch.exchange_delete(""),
    ],
    ids=["passive", "declare", "delete"],
)
def test_the_default_exchange_is_refused_403(
    connection: pika.BlockingConnection, action: Callable[[BlockingChannel], object]
) -> None:
    assert refused(connection.channel(), action) == 403
    assert connection.channel().exchange_declare("amq.direct", passive=True)


def test_any_channel_number_opens_and_channel_max_counts_open_channels(amqp_url: str) -> None:
    # aiormq's test_bad_channel opens channel 65535, as RabbitMQ lets it.
    parameters = pika.URLParameters(amqp_url)
    parameters.channel_max = 3
    connection = pika.BlockingConnection(parameters)
    try:
        for number in (65535, 4000):
            connection.channel(number).queue_declare("", exclusive=True)
        connection.channel(1)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            connection.channel(2)
        assert info.value.reply_code == 530  # NOT_ALLOWED
    finally:
        if connection.is_open:
            connection.close()
