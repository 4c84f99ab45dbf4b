"""Queue arguments through pika against a real ``halfmoon serve``: x-expires, x-max-priority,
x-max-length-bytes, and their validation."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pika
import pika.exceptions
import pytest

from tests.amqp.test_pika import name
from tests.waiting import wait_until


@pytest.fixture
def connection(amqp_url: str) -> Iterator[pika.BlockingConnection]:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        yield conn
    finally:
        if conn.is_open:
            conn.close()


def exists(connection: pika.BlockingConnection, queue: str) -> bool:
    channel = connection.channel()
    try:
        channel.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    channel.close()
    return True


def test_x_expires_deletes_an_unused_queue(connection: pika.BlockingConnection) -> None:
    idle, used = name("idle"), name("used")
    ch = connection.channel()
    ch.queue_declare(idle, arguments={"x-expires": 1000})
    ch.queue_declare(used, arguments={"x-expires": 1000})
    ch.basic_consume(used, lambda *a: None, consumer_tag="keeper")
    started = time.monotonic()
    wait_until(lambda: not exists(connection, idle), 20, "the idle queue deleted", 0.2)
    assert time.monotonic() - started >= 0.5  # not before it was unused for long
    connection.sleep(2.0)  # two more sweeps: a consumed queue is in use
    assert exists(connection, used)
    ch.basic_cancel("keeper")
    wait_until(lambda: not exists(connection, used), 20, "the queue deleted once unused", 0.2)


def drain(channel: object, queue: str) -> list[bytes]:
    out = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)  # type: ignore[attr-defined]
        if method is None:
            return out
        out.append(body)


def test_x_max_priority_delivers_the_highest_priority_first(
    connection: pika.BlockingConnection,
) -> None:
    ch = connection.channel()
    q = name("prio")
    ch.queue_declare(q, arguments={"x-max-priority": 5})
    ch.confirm_delivery()
    for body, priority in ((b"p1", 1), (b"none", None), (b"p5", 5), (b"p9", 9), (b"p3", 3)):
        ch.basic_publish("", q, body, pika.BasicProperties(priority=priority))
    # Above the maximum counts as the maximum (RabbitMQ's rule); equal priorities keep order.
    assert drain(ch, q) == [b"p5", b"p9", b"p3", b"p1", b"none"]
    # A consumer of a backlog sees the same order, and the property is delivered as sent.
    for body, priority in ((b"low", 0), (b"high", 4)):
        ch.basic_publish("", q, body, pika.BasicProperties(priority=priority))
    got: list[tuple[bytes, int | None]] = []
    ch.basic_consume(q, lambda c, m, p, b: got.append((b, p.priority)), auto_ack=True)
    wait_until(lambda: connection.process_data_events(0.1) or len(got) == 2, 15, "two deliveries")
    assert got == [(b"high", 4), (b"low", 0)]


def test_x_max_priority_in_a_transaction_and_when_dead_lettered(
    connection: pika.BlockingConnection,
) -> None:
    ch = connection.channel()
    prio, source = name("prio-tx"), name("to-prio")
    ch.queue_declare(prio, arguments={"x-max-priority": 3})
    ch.queue_declare(
        source, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": prio}
    )
    ch.basic_publish("", source, b"dead-high", pika.BasicProperties(priority=3))
    method, _, _ = ch.basic_get(source)
    ch.basic_reject(method.delivery_tag, requeue=False)
    ch.tx_select()
    ch.basic_publish("", prio, b"tx-low", pika.BasicProperties(priority=0))
    ch.basic_publish("", prio, b"tx-mid", pika.BasicProperties(priority=2))
    ch.tx_commit()
    assert drain(ch, prio) == [b"dead-high", b"tx-mid", b"tx-low"]


def test_x_max_length_bytes_drops_the_head_or_rejects(
    connection: pika.BlockingConnection,
) -> None:
    ch = connection.channel()
    capped, full = name("bytes"), name("bytes-full")
    ch.queue_declare(capped, arguments={"x-max-length-bytes": 10})
    for body in (b"aaaa", b"bbbb", b"cccc"):  # 12 bytes: the oldest goes
        ch.basic_publish("", capped, body)
    assert drain(ch, capped) == [b"bbbb", b"cccc"]
    ch.queue_declare(full, arguments={"x-max-length-bytes": 10, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", full, b"123456")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", full, b"12345")  # would make 11
    ch.basic_publish("", full, b"1234")  # fits exactly
    assert drain(ch, full) == [b"123456", b"1234"]


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("x-expires", 0),
        ("x-expires", -5),
        ("x-expires", "soon"),
        ("x-max-priority", 0),
        ("x-max-priority", 256),
        ("x-max-priority", "high"),
        ("x-max-length-bytes", -1),
    ],
)
def test_invalid_arguments_are_406(
    connection: pika.BlockingConnection, argument: str, value: object
) -> None:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        connection.channel().queue_declare(name("bad"), arguments={argument: value})
    assert info.value.reply_code == 406 and argument in info.value.reply_text


def test_length_limits_apply_to_a_transaction_at_commit(
    connection: pika.BlockingConnection,
) -> None:
    ch = connection.channel()
    full, head, by_bytes = name("tx-full"), name("tx-head"), name("tx-bytes")
    ch.queue_declare(full, arguments={"x-max-length": 3, "x-overflow": "reject-publish"})
    ch.queue_declare(head, arguments={"x-max-length": 2})
    ch.queue_declare(by_bytes, arguments={"x-max-length-bytes": 10, "x-overflow": "reject-publish"})
    ch.basic_publish("", full, b"before")
    ch.tx_select()
    for i in range(4):
        ch.basic_publish("", full, b"tx%d" % i)
        ch.basic_publish("", head, b"tx%d" % i)
    for body in (b"12345", b"123456", b"1234"):  # the second would make 11 bytes
        ch.basic_publish("", by_bytes, body)
    ch.tx_rollback()  # nothing of it applies, limits or not
    assert ch.queue_declare(full, passive=True).method.message_count == 1
    assert ch.queue_declare(head, passive=True).method.message_count == 0
    for i in range(4):
        ch.basic_publish("", full, b"tx%d" % i)
        ch.basic_publish("", head, b"tx%d" % i)
    for body in (b"12345", b"123456", b"1234"):
        ch.basic_publish("", by_bytes, body)
    ch.tx_commit()
    # Counted at commit with what the queue held and the transaction's earlier publishes.
    assert drain(ch, full) == [b"before", b"tx0", b"tx1"]
    assert drain(ch, head) == [b"tx2", b"tx3"]
    assert drain(ch, by_bytes) == [b"12345", b"1234"]


def test_a_transaction_refused_by_reject_publish_dlx_dead_letters_at_commit(
    connection: pika.BlockingConnection,
) -> None:
    ch = connection.channel()
    dlx, full, dlq = name("tx-dlx"), name("tx-full-dlx"), name("tx-dlq")
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx)
    ch.queue_declare(
        full,
        arguments={
            "x-max-length": 1,
            "x-overflow": "reject-publish-dlx",
            "x-dead-letter-exchange": dlx,
        },
    )
    ch.tx_select()
    ch.basic_publish("", full, b"fits")
    ch.basic_publish("", full, b"refused")
    assert ch.queue_declare(dlq, passive=True).method.message_count == 0  # not before commit
    ch.tx_commit()
    assert drain(ch, full) == [b"fits"]
    [(death_reason, body)] = [
        (props.headers["x-death"][0]["reason"], body)
        for method, props, body in iter(
            lambda: ch.basic_get(dlq, auto_ack=True), (None, None, None)
        )
    ]
    assert body == b"refused" and death_reason in (b"maxlen", "maxlen")
