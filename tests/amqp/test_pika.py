"""The AMQP endpoint through pika's blocking adapter: each feature as a client uses it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.server.conftest import ServerProcess


def name(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


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


def get_body(channel: BlockingChannel, queue: str) -> bytes | None:
    method, _props, body = channel.basic_get(queue, auto_ack=True)
    return body if method is not None else None


def test_server_properties_name_halfmoon_and_its_capabilities(
    connection: pika.BlockingConnection,
) -> None:
    props = connection._impl.server_properties
    assert props["product"] == b"halfmoon" or props["product"] == "halfmoon"
    caps = props["capabilities"]
    for cap in (
        "publisher_confirms",
        "basic.nack",
        "consumer_cancel_notify",
        "exchange_exchange_bindings",
        "authentication_failure_close",
        "per_consumer_qos",
    ):
        assert caps[cap] is True, cap


def test_publish_and_get_keep_properties_and_headers(channel: BlockingChannel) -> None:
    q = name("props")
    channel.queue_declare(q, durable=True)
    props = pika.BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        headers={"a": 1, "nested": {"b": [1, "two"]}, "s": "x"},
        delivery_mode=2,
        priority=3,
        correlation_id="c1",
        reply_to="r",
        expiration="60000",
        message_id="m1",
        timestamp=1700000000,
        type="t",
        user_id="guest",
        app_id="app",
    )
    channel.basic_publish("", q, b"payload", props)
    method, got, body = channel.basic_get(q, auto_ack=True)
    assert method is not None and body == b"payload"
    assert method.routing_key == q and method.exchange == "" and not method.redelivered
    for field in (
        "content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
        "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id",
    ):  # fmt: skip
        assert getattr(got, field) == getattr(props, field), field
    assert got.headers == {"a": 1, "nested": {"b": [1, b"two"]}, "s": b"x"} or got.headers == {
        "a": 1,
        "nested": {"b": [1, "two"]},
        "s": "x",
    }
    assert channel.basic_get(q)[0] is None  # GetEmpty


def test_large_body_spans_frames(channel: BlockingChannel) -> None:
    q = name("large")
    channel.queue_declare(q)
    body = bytes(range(256)) * 4096  # 1 MiB, many body frames each way
    channel.basic_publish("", q, body)
    assert get_body(channel, q) == body


def test_server_named_queue_and_declare_ok_counts(channel: BlockingChannel) -> None:
    declared = channel.queue_declare("", exclusive=True)
    q = declared.method.queue
    assert q.startswith("amq.gen-")
    channel.basic_publish("", q, b"1")
    channel.basic_publish("", q, b"2")
    again = channel.queue_declare(q, passive=True)
    assert again.method.message_count == 2


def test_exchange_types_route_as_rabbitmq(channel: BlockingChannel) -> None:
    direct, fanout, topic, headers = (name(t) for t in ("d", "f", "t", "h"))
    channel.exchange_declare(direct, "direct")
    channel.exchange_declare(fanout, "fanout")
    channel.exchange_declare(topic, "topic")
    channel.exchange_declare(headers, "headers")
    qs = {k: name(k) for k in ("d", "f1", "f2", "t1", "t2", "h_all", "h_any")}
    for q in qs.values():
        channel.queue_declare(q)
    channel.queue_bind(qs["d"], direct, "red")
    channel.queue_bind(qs["f1"], fanout)
    channel.queue_bind(qs["f2"], fanout)
    channel.queue_bind(qs["t1"], topic, "stock.*.nyse")
    channel.queue_bind(qs["t2"], topic, "stock.#")
    channel.queue_bind(qs["h_all"], headers, arguments={"x-match": "all", "a": 1, "b": "x"})
    channel.queue_bind(qs["h_any"], headers, arguments={"x-match": "any", "a": 1, "b": "x"})

    channel.basic_publish(direct, "red", b"d-red")
    channel.basic_publish(direct, "blue", b"d-blue")
    channel.basic_publish(fanout, "whatever", b"f")
    channel.basic_publish(topic, "stock.ibm.nyse", b"t-ibm")
    channel.basic_publish(topic, "stock.ibm.a.nyse", b"t-deep")
    channel.basic_publish(headers, "", b"h-both", pika.BasicProperties(headers={"a": 1, "b": "x"}))
    channel.basic_publish(headers, "", b"h-one", pika.BasicProperties(headers={"a": 1}))

    def drain(q: str) -> list[bytes]:
        out = []
        while (body := get_body(channel, q)) is not None:
            out.append(body)
        return out

    assert drain(qs["d"]) == [b"d-red"]
    assert drain(qs["f1"]) == [b"f"] and drain(qs["f2"]) == [b"f"]
    assert drain(qs["t1"]) == [b"t-ibm"]
    assert drain(qs["t2"]) == [b"t-ibm", b"t-deep"]
    assert drain(qs["h_all"]) == [b"h-both"]
    assert drain(qs["h_any"]) == [b"h-both", b"h-one"]


def test_amq_exchanges_exist_and_exchange_to_exchange_bindings_route(
    channel: BlockingChannel,
) -> None:
    for builtin in ("amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"):
        channel.exchange_declare(builtin, passive=True)
    upstream, downstream, q = name("up"), name("down"), name("e2e")
    channel.exchange_declare(upstream, "topic")
    channel.exchange_declare(downstream, "fanout")
    channel.exchange_bind(downstream, upstream, "a.#")
    channel.queue_declare(q)
    channel.queue_bind(q, downstream)
    channel.basic_publish(upstream, "a.b", b"through")
    channel.basic_publish(upstream, "b.b", b"not")
    assert get_body(channel, q) == b"through"
    assert get_body(channel, q) is None
    channel.exchange_unbind(downstream, upstream, "a.#")
    channel.basic_publish(upstream, "a.b", b"after unbind")
    assert get_body(channel, q) is None


def test_redeclare_with_other_arguments_is_406(connection: pika.BlockingConnection) -> None:
    ch = connection.channel()
    ex = name("ex")
    ch.exchange_declare(ex, "direct", durable=True)
    ch.exchange_declare(ex, "direct", durable=True)  # same: fine
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(ex, "fanout", durable=True)
    assert info.value.reply_code == 406 and "inequivalent" in info.value.reply_text
    ch = connection.channel()
    q = name("q")
    ch.queue_declare(q, arguments={"x-max-length": 10})
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(q, arguments={"x-max-length": 11})
    assert info.value.reply_code == 406


@pytest.mark.parametrize(
    ("action", "code"),
    [
        (lambda ch: ch.queue_declare(name("missing"), passive=True), 404),
        (lambda ch: ch.exchange_declare(name("missing"), passive=True), 404),
        (lambda ch: ch.basic_publish(name("missing"), "k", b""), 404),
        (lambda ch: ch.exchange_declare("amq.mine", "direct"), 403),
        (lambda ch: ch.queue_bind("q", ""), 403),
        (lambda ch: ch.queue_declare(name("q"), arguments={"x-queue-type": "stream2"}), 406),
        (lambda ch: ch.basic_ack(999), 406),
    ],
    ids=[
        "passive-queue", "passive-exchange", "publish-missing-exchange", "reserved-name",
        "bind-default", "queue-type", "unknown-tag",
    ],
)  # fmt: skip
def test_channel_errors_carry_rabbitmq_codes(
    connection: pika.BlockingConnection, action: object, code: int
) -> None:
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        action(ch)  # type: ignore[operator]
        ch.queue_declare(name("sync"))  # an async error (publish, ack) shows on the next call
    assert info.value.reply_code == code
    assert " - " in info.value.reply_text  # "NOT_FOUND - no queue ..."
    assert connection.is_open
    connection.channel().queue_declare(name("still-works"))


def test_exclusive_queue_is_locked_to_its_connection(
    amqp_url: str, channel: BlockingChannel
) -> None:
    q = name("excl")
    channel.queue_declare(q, exclusive=True)
    other = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            other.channel().queue_declare(q, passive=True)
        assert info.value.reply_code == 405
    finally:
        other.close()


def test_delete_if_unused_if_empty_and_purge(
    channel: BlockingChannel, connection: pika.BlockingConnection
) -> None:
    q = name("del")
    channel.queue_declare(q)
    channel.basic_publish("", q, b"1")
    channel.basic_publish("", q, b"2")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.queue_delete(q, if_empty=True)
    assert info.value.reply_code == 406
    ch = connection.channel()
    assert ch.queue_purge(q).method.message_count == 2
    assert ch.basic_get(q)[0] is None
    ch.queue_delete(q)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        ch.queue_declare(q, passive=True)


def test_mandatory_unroutable_is_returned_312(channel: BlockingChannel) -> None:
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError) as info:
        channel.basic_publish("amq.direct", name("nobody"), b"lost", mandatory=True)
    [returned] = info.value.messages
    assert returned.method.reply_code == 312 and returned.body == b"lost"
    channel.basic_publish("amq.direct", name("nobody"), b"dropped")  # not mandatory: acked


def test_consume_ack_nack_requeue_and_redelivered(channel: BlockingChannel) -> None:
    q = name("cons")
    channel.queue_declare(q)
    for i in range(3):
        channel.basic_publish("", q, str(i).encode())
    channel.basic_qos(prefetch_count=10)
    seen: list[tuple[bytes, bool]] = []
    for method, _props, body in channel.consume(q, inactivity_timeout=10):
        assert method is not None, "nothing delivered"
        seen.append((body, method.redelivered))
        if body == b"1" and not method.redelivered:
            channel.basic_nack(method.delivery_tag, requeue=True)
        else:
            channel.basic_ack(method.delivery_tag)
        if len(seen) == 4:
            break
    channel.cancel()
    assert sorted(seen) == [(b"0", False), (b"1", False), (b"1", True), (b"2", False)]


def pump_until(connection: pika.BlockingConnection, done: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:  # type: ignore[operator]
        connection.process_data_events(time_limit=0.1)


def test_prefetch_limits_unacked_deliveries(channel: BlockingChannel) -> None:
    q = name("qos")
    channel.queue_declare(q)
    for i in range(10):
        channel.basic_publish("", q, str(i).encode())
    channel.basic_qos(prefetch_count=3)
    got: list[int] = []
    channel.basic_consume(q, lambda ch, m, p, b: got.append(m.delivery_tag))
    pump_until(channel.connection, lambda: len(got) >= 3)
    # The server holds the other 7 back: they are still ready in the queue.
    assert channel.queue_declare(q, passive=True).method.message_count == 7
    assert len(got) == 3
    channel.basic_ack(got[-1], multiple=True)
    pump_until(channel.connection, lambda: len(got) >= 6)
    assert channel.queue_declare(q, passive=True).method.message_count == 4
    assert len(got) == 6


def test_unacked_return_to_the_queue_when_the_channel_closes(
    connection: pika.BlockingConnection,
) -> None:
    ch = connection.channel()
    q = name("back")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"held")
    method, _, _ = ch.basic_get(q)
    assert method is not None
    ch.close()
    ch2 = connection.channel()
    for _ in range(50):
        method, _, body = ch2.basic_get(q, auto_ack=True)
        if method is not None:
            break
        connection.sleep(0.1)
    assert method is not None and body == b"held" and method.redelivered


def test_server_sends_cancel_when_the_queue_is_deleted(connection: pika.BlockingConnection) -> None:
    ch = connection.channel()
    q = name("gone")
    ch.queue_declare(q)
    cancelled: list[object] = []
    ch.add_on_cancel_callback(cancelled.append)
    ch.basic_consume(q, lambda *a: None)
    connection.channel().queue_delete(q)
    pump_until(connection, lambda: cancelled)
    assert len(cancelled) == 1


def test_publisher_confirms_ack_each_publish(channel: BlockingChannel) -> None:
    q = name("confirm")
    channel.queue_declare(q, durable=True)
    channel.confirm_delivery()
    for i in range(20):
        channel.basic_publish("", q, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    assert channel.queue_declare(q, passive=True).method.message_count == 20


def test_tx_commit_applies_publishes_and_acks_together(channel: BlockingChannel) -> None:
    source, out = name("txa"), name("txb")
    channel.queue_declare(source)
    channel.queue_declare(out)
    channel.basic_publish("", source, b"in")
    channel.tx_select()
    method, _, body = channel.basic_get(source)
    assert method is not None and body == b"in"
    channel.basic_publish("", out, b"out")
    channel.basic_ack(method.delivery_tag)
    assert channel.basic_get(out, auto_ack=False)[0] is None  # nothing visible before commit
    channel.tx_commit()
    assert get_body(channel, out) == b"out"
    channel.tx_commit()
    assert channel.queue_declare(source, passive=True).method.message_count == 0


def test_tx_rollback_applies_nothing(channel: BlockingChannel) -> None:
    source, out = name("rba"), name("rbb")
    channel.queue_declare(source)
    channel.queue_declare(out)
    channel.basic_publish("", source, b"in")
    channel.tx_select()
    method, _, _ = channel.basic_get(source)
    assert method is not None
    channel.basic_publish("", out, b"never")
    channel.basic_ack(method.delivery_tag)
    channel.tx_rollback()
    assert get_body(channel, out) is None
    channel.basic_ack(method.delivery_tag)  # still unacked after the rollback: ack again
    channel.tx_commit()
    assert channel.queue_declare(source, passive=True).method.message_count == 0


def test_tx_and_confirm_on_one_channel_is_406(connection: pika.BlockingConnection) -> None:
    ch = connection.channel()
    ch.tx_select()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.confirm_delivery()
    assert info.value.reply_code == 406


def test_durable_topology_survives_a_restart(amqp_server: ServerProcess, amqp_url: str) -> None:
    ex, q = name("keep"), name("keepq")
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    ch.exchange_declare(ex, "topic", durable=True)
    ch.queue_declare(q, durable=True)
    ch.queue_bind(q, ex, "k.*")
    ch.confirm_delivery()
    ch.basic_publish(ex, "k.1", b"kept", pika.BasicProperties(delivery_mode=2))
    conn.close()
    amqp_server.stop()
    amqp_server.settings = amqp_server.settings[:-1] + (
        f"server.amqp_listen={amqp_server.amqp_address}",
    )
    amqp_server.start()
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        ch = conn.channel()
        assert get_body(ch, q) == b"kept"
        ch.basic_publish(ex, "k.2", b"routed after restart")
        assert get_body(ch, q) == b"routed after restart"
    finally:
        conn.close()


def test_message_ttl_and_per_message_expiration_drop_expired_messages(
    channel: BlockingChannel,
) -> None:
    q = name("ttl")
    channel.queue_declare(q, arguments={"x-message-ttl": 200})
    channel.basic_publish("", q, b"short")
    channel.basic_publish("", q, b"shorter", pika.BasicProperties(expiration="50"))
    time.sleep(0.4)  # the condition under test is time passing
    channel.basic_publish("", q, b"fresh", pika.BasicProperties(expiration="60000"))
    assert get_body(channel, q) == b"fresh"
    assert get_body(channel, q) is None


def test_x_message_ttl_must_be_a_non_negative_integer(connection: pika.BlockingConnection) -> None:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        connection.channel().queue_declare(name("bad"), arguments={"x-message-ttl": "soon"})
    assert info.value.reply_code == 406 and "x-message-ttl" in info.value.reply_text


def test_x_delay_holds_a_message_back_on_a_delayed_message_exchange(
    channel: BlockingChannel,
) -> None:
    ex, q = name("delayed"), name("later")
    channel.exchange_declare(ex, "x-delayed-message", arguments={"x-delayed-type": "direct"})
    channel.queue_declare(q)
    channel.queue_bind(q, ex, "k")
    started = time.monotonic()
    channel.basic_publish(ex, "k", b"later", pika.BasicProperties(headers={"x-delay": 1500}))
    channel.basic_publish(ex, "k", b"now")
    assert get_body(channel, q) == b"now"
    body = None
    deadline = time.monotonic() + 15
    while body is None and time.monotonic() < deadline:
        body = get_body(channel, q)
        if body is None:
            channel.connection.sleep(0.1)
    assert body == b"later" and time.monotonic() - started >= 1.4


def test_single_active_consumer_gets_everything_until_it_goes(
    connection: pika.BlockingConnection,
) -> None:
    q = name("sac")
    ch = connection.channel()
    ch.queue_declare(q, arguments={"x-single-active-consumer": True})
    first: list[bytes] = []
    second: list[bytes] = []
    ch.basic_consume(q, lambda c, m, p, b: first.append(b), auto_ack=True, consumer_tag="one")
    ch.basic_consume(q, lambda c, m, p, b: second.append(b), auto_ack=True, consumer_tag="two")
    for i in range(4):
        ch.basic_publish("", q, str(i).encode())
    pump_until(connection, lambda: len(first) == 4)
    assert first == [b"0", b"1", b"2", b"3"] and second == []
    ch.basic_cancel("one")
    ch.basic_publish("", q, b"after")
    pump_until(connection, lambda: second)
    assert second == [b"after"] and len(first) == 4


def test_max_length_drop_head_keeps_the_newest(channel: BlockingChannel) -> None:
    q = name("cap")
    channel.queue_declare(q, arguments={"x-max-length": 2})
    for i in range(5):
        channel.basic_publish("", q, str(i).encode())
    assert [get_body(channel, q), get_body(channel, q), get_body(channel, q)] == [b"3", b"4", None]


def test_max_length_reject_publish_nacks_when_full(channel: BlockingChannel) -> None:
    q = name("full")
    channel.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    channel.basic_publish("", q, b"first")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", q, b"second")
    assert get_body(channel, q) == b"first" and get_body(channel, q) is None


def test_a_delivery_in_flight_when_its_consumer_stops_is_back_before_the_channel_closes(
    connection: pika.BlockingConnection,
) -> None:
    # pika's own TestStopConsumingFromBasicConsumeCallback: the consumer may be popping the
    # second message from the broker when the client cancels it and closes the channel; that
    # message must be back in the queue by Close-Ok, not hidden for the delivery timeout.
    for attempt in range(15):
        ch = connection.channel()
        ch.confirm_delivery()
        q = name(f"stop-{attempt}")
        ch.queue_declare(q, exclusive=True)
        for body in (b"first", b"second"):
            ch.basic_publish("", q, body, mandatory=True)

        def on_message(channel: BlockingChannel, method, properties, body) -> None:  # type: ignore[no-untyped-def]
            channel.stop_consuming()
            channel.basic_ack(method.delivery_tag)

        ch.basic_consume(q, on_message)
        ch.start_consuming()
        ch.close()
        ch = connection.channel()
        assert get_body(ch, q) == b"second", f"attempt {attempt}"
        assert get_body(ch, q) is None
        ch.close()


def test_connections_closed_after_a_channel_error_leave_no_task_behind(
    amqp_server: ServerProcess, amqp_url: str
) -> None:
    """A channel closed by the server (a 404), then its connection closed by the client: the
    channel's task ends with its Close-Ok, and the connection's cleanup is held until it ends,
    so the event loop never collects a pending task ("Task was destroyed but it is pending!",
    logged as an error)."""
    for _ in range(200):
        opened = pika.BlockingConnection(pika.URLParameters(amqp_url))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            opened.channel().queue_declare(name("absent"), passive=True)
        opened.close()
    held = pika.BlockingConnection(pika.URLParameters(amqp_url))  # the server still answers
    held.channel().queue_declare(name("present"))
    held.close()
    destroyed = [line for line in amqp_server.lines if "Task was destroyed" in line]
    assert not destroyed, amqp_server.log_tail()
