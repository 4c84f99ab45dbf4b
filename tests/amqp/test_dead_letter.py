"""Dead-lettering through pika against a real ``halfmoon serve``: each way a message dies."""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.amqp.test_pika import get_body, name
from tests.waiting import wait_until


@pytest.fixture
def connection(amqp_url: str) -> Iterator[pika.BlockingConnection]:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        yield conn
    finally:
        if conn.is_open:
            conn.close()


@pytest.fixture
def channel(connection: pika.BlockingConnection) -> BlockingChannel:
    return connection.channel()


def dead_letter_pair(channel: BlockingChannel, **arguments: object) -> tuple[str, str, str]:
    """A source queue whose dead-letter exchange (fanout) routes to a queue of its own:
    (exchange, source, dead-letter queue)."""
    dlx, source, dlq = name("dlx"), name("src"), name("dlq")
    channel.exchange_declare(dlx, "fanout")
    channel.queue_declare(dlq)
    channel.queue_bind(dlq, dlx)
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": dlx, **arguments})
    return dlx, source, dlq


def get_message(
    channel: BlockingChannel, queue: str, timeout: float = 15.0
) -> tuple[pika.spec.Basic.GetOk, pika.BasicProperties, bytes]:
    found = wait_until(
        lambda: (lambda got: got if got[0] is not None else None)(
            channel.basic_get(queue, auto_ack=True)
        ),
        timeout,
        f"a message in {queue}",
        interval=0.1,
    )
    return found  # type: ignore[no-any-return]


def text(value: object) -> object:
    return value.decode() if isinstance(value, bytes) else value


def test_reject_without_requeue_dead_letters_with_x_death(channel: BlockingChannel) -> None:
    dlx, source, dlq = dead_letter_pair(channel)
    props = pika.BasicProperties(headers={"mine": "kept"}, content_type="text/plain")
    channel.basic_publish("", source, b"bad", props)
    method, _, _ = channel.basic_get(source)
    assert method is not None
    channel.basic_reject(method.delivery_tag, requeue=False)

    got, props_out, body = get_message(channel, dlq)
    assert body == b"bad" and props_out.content_type == "text/plain"
    assert got.exchange == dlx and got.routing_key == source
    headers = props_out.headers
    assert text(headers["mine"]) == "kept"
    [death] = headers["x-death"]
    assert text(death["reason"]) == "rejected" and death["count"] == 1
    assert text(death["queue"]) == source and text(death["exchange"]) == ""
    assert [text(k) for k in death["routing-keys"]] == [source]
    assert death["time"] is not None
    assert text(headers["x-first-death-queue"]) == source
    assert text(headers["x-first-death-reason"]) == "rejected"
    assert text(headers["x-last-death-queue"]) == source
    assert get_body(channel, source) is None  # gone from the source


def test_nack_multiple_dead_letters_to_the_routing_key(channel: BlockingChannel) -> None:
    dlx, target = name("dlx-direct"), name("parked")
    channel.exchange_declare(dlx, "direct")
    channel.queue_declare(target)
    channel.queue_bind(target, dlx, "parked")
    source = name("work")
    channel.queue_declare(
        source,
        arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "parked"},
    )
    for i in range(3):
        channel.basic_publish("", source, str(i).encode())
    tags = []
    for _ in range(3):
        method, _, _ = channel.basic_get(source)
        tags.append(method.delivery_tag)
    channel.basic_nack(tags[-1], multiple=True, requeue=False)
    bodies = sorted(get_message(channel, target)[2] for _ in range(3))
    assert bodies == [b"0", b"1", b"2"]
    assert get_body(channel, source) is None


def test_requeue_and_plain_reject_without_dead_letter_exchange(channel: BlockingChannel) -> None:
    _, source, dlq = dead_letter_pair(channel)
    channel.basic_publish("", source, b"again")
    method, _, _ = channel.basic_get(source)
    channel.basic_reject(method.delivery_tag, requeue=True)  # requeued: not dead-lettered
    assert get_message(channel, source)[2] == b"again"
    plain = name("plain")
    channel.queue_declare(plain)
    channel.basic_publish("", plain, b"dropped")
    method, _, _ = channel.basic_get(plain)
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert channel.queue_declare(plain, passive=True).method.message_count == 0
    assert get_body(channel, dlq) is None


def test_expired_messages_are_dead_lettered_without_a_consumer(channel: BlockingChannel) -> None:
    _, source, dlq = dead_letter_pair(channel, **{"x-message-ttl": 100})
    channel.basic_publish("", source, b"queue-ttl")
    got, props, body = get_message(channel, dlq)  # moved by the server alone
    assert body == b"queue-ttl"
    [death] = props.headers["x-death"]
    assert text(death["reason"]) == "expired" and "original-expiration" not in death

    _, source2, dlq2 = dead_letter_pair(channel)
    channel.basic_publish("", source2, b"own-ttl", pika.BasicProperties(expiration="100"))
    _, props, body = get_message(channel, dlq2)
    assert body == b"own-ttl" and props.expiration is None  # removed from the copy
    [death] = props.headers["x-death"]
    assert text(death["reason"]) == "expired" and text(death["original-expiration"]) == "100"
    assert channel.queue_declare(source2, passive=True).method.message_count == 0


def test_max_length_drop_head_and_reject_publish_dlx_dead_letter_maxlen(
    channel: BlockingChannel,
) -> None:
    _, source, dlq = dead_letter_pair(channel, **{"x-max-length": 1})
    channel.basic_publish("", source, b"old")
    channel.basic_publish("", source, b"new")
    _, props, body = get_message(channel, dlq)
    assert body == b"old" and text(props.headers["x-death"][0]["reason"]) == "maxlen"
    assert get_body(channel, source) == b"new"

    _, full, dlq2 = dead_letter_pair(
        channel, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"}
    )
    channel.confirm_delivery()
    channel.basic_publish("", full, b"first")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", full, b"refused")
    _, props, body = get_message(channel, dlq2)
    assert body == b"refused" and text(props.headers["x-death"][0]["reason"]) == "maxlen"
    assert get_body(channel, full) == b"first"


def test_retry_through_a_ttl_queue_counts_each_death(channel: BlockingChannel) -> None:
    """work rejects into retry (TTL), which expires back into work: x-death counts both."""
    work, retry = name("work"), name("retry")
    channel.queue_declare(
        work, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": retry}
    )
    channel.queue_declare(
        retry,
        arguments={
            "x-message-ttl": 50,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": work,
        },
    )
    counts: dict[tuple[str, str], int] = {}
    channel.basic_publish("", work, b"flaky2")
    for _ in range(2):
        method = wait_until(lambda: channel.basic_get(work)[0], 15, "flaky2 in work", 0.1)
        channel.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = wait_until(
        lambda: (lambda g: g if g[0] is not None and g[2] == b"flaky2" else None)(
            channel.basic_get(work, auto_ack=True)
        ),
        15,
        "flaky2 after two retries",
        0.1,
    )
    deaths = props.headers["x-death"]
    for d in deaths:
        counts[(text(d["queue"]), text(d["reason"]))] = d["count"]
    assert counts == {(work, "rejected"): 2, (retry, "expired"): 2}
    assert text(deaths[0]["queue"]) == retry  # the most recent death first
    assert text(props.headers["x-first-death-queue"]) == work
    assert text(props.headers["x-last-death-queue"]) == retry


def test_a_queue_dead_lettering_expired_messages_into_itself_drops_them(
    channel: BlockingChannel,
) -> None:
    loop = name("loop")
    channel.queue_declare(
        loop,
        arguments={
            "x-message-ttl": 50,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": loop,
        },
    )
    channel.basic_publish("", loop, b"round and round")
    wait_until(
        lambda: channel.queue_declare(loop, passive=True).method.message_count == 0,
        15,
        "the cycle dropped",
        0.1,
    )
    # Not back a moment later either (it was dropped, not moving in circles).
    channel.connection.sleep(2.5)
    assert channel.queue_declare(loop, passive=True).method.message_count == 0
    assert get_body(channel, loop) is None


def test_reject_in_a_transaction_dead_letters_only_at_commit(channel: BlockingChannel) -> None:
    _, source, dlq = dead_letter_pair(channel)
    channel.basic_publish("", source, b"tx")
    channel.tx_select()
    method, _, _ = channel.basic_get(source)
    channel.basic_reject(method.delivery_tag, requeue=False)
    channel.tx_rollback()
    assert get_body(channel, dlq) is None  # rolled back: no copy
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert get_body(channel, dlq) is None  # not yet committed
    channel.tx_commit()
    got, props, body = get_message(channel, dlq)
    assert body == b"tx" and text(props.headers["x-death"][0]["reason"]) == "rejected"
    channel.tx_commit()


def test_dead_letter_arguments_are_validated(connection: pika.BlockingConnection) -> None:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        connection.channel().queue_declare(
            name("bad"), arguments={"x-dead-letter-routing-key": "k"}
        )
    assert info.value.reply_code == 406 and "x-dead-letter-exchange" in info.value.reply_text


def test_a_missing_dead_letter_exchange_drops_the_message(channel: BlockingChannel) -> None:
    source = name("orphan")
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": name("never-declared")})
    channel.basic_publish("", source, b"nowhere to go")
    method, _, _ = channel.basic_get(source)
    channel.basic_reject(method.delivery_tag, requeue=False)
    # Dropped, as RabbitMQ drops it: neither back in its queue nor held as a delivery.
    assert channel.queue_declare(source, passive=True).method.message_count == 0
    channel.close()
    again = channel.connection.channel()
    assert again.basic_get(source, auto_ack=True)[0] is None
