"""The rows of RabbitMQ's "Broker Semantics" table for halfmoon's AMQP ``tx``, through pika.

Each test backs a cell of the halfmoon AMQP column of the table in docs/transactions.md
("Semantics"); ``test_every_test_the_table_names_exists`` keeps the table and the tests
in step.
"""

from __future__ import annotations

import random
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.amqp.test_tx_crash import connect
from tests.server.conftest import ROOT, ServerProcess
from tests.waiting import wait_until


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
def tx(connection: pika.BlockingConnection) -> BlockingChannel:
    """A channel in Tx.Select."""
    channel = connection.channel()
    channel.tx_select()
    return channel


@pytest.fixture
def observer(amqp_url: str) -> Iterator[BlockingChannel]:
    """A channel of another connection, which sees what the others' commits made visible."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        yield conn.channel()
    finally:
        if conn.is_open:
            conn.close()


def nothing_visible(channel: BlockingChannel, queue: str) -> bool:
    """No message of ``queue`` can be taken (a Basic.Get answers GetEmpty)."""
    return channel.basic_get(queue, auto_ack=True)[0] is None


def get_within(channel: BlockingChannel, queue: str, timeout: float = 15.0, ack: bool = True):
    """Basic.Get until a message comes: (method, body)."""

    def got() -> tuple | None:
        method, _props, body = channel.basic_get(queue, auto_ack=ack)
        return (method, body) if method is not None else None

    return wait_until(got, timeout, f"a message on {queue}")


def declared(channel: BlockingChannel, *queues: str) -> None:
    for queue in queues:
        channel.queue_declare(queue)


# -- transactional basic.publish ---------------------------------------------------------


def test_publishes_to_many_queues_appear_only_on_commit(
    tx: BlockingChannel, observer: BlockingChannel
) -> None:
    queues = [name("pub") for _ in range(3)]
    exchange = name("fan")
    tx.exchange_declare(exchange, "fanout")
    for queue in queues:
        tx.queue_declare(queue)
        tx.queue_bind(queue, exchange)
    tx.basic_publish(exchange, "", b"fanned")
    tx.basic_publish("", queues[0], b"direct")
    tx.queue_declare(queues[0], passive=True)  # the publishes above are handled by now
    assert all(nothing_visible(observer, q) for q in queues)
    tx.tx_commit()
    bodies = {q: [get_within(observer, q)[1]] for q in queues}
    bodies[queues[0]].append(get_within(observer, queues[0])[1])
    assert sorted(bodies[queues[0]]) == [b"direct", b"fanned"]
    assert bodies[queues[1]] == bodies[queues[2]] == [b"fanned"]


def test_rollback_discards_every_publish(tx: BlockingChannel, observer: BlockingChannel) -> None:
    a, b = name("rba"), name("rbb")
    declared(tx, a, b)
    for i in range(5):
        tx.basic_publish("", a if i % 2 else b, b"never")
    tx.tx_rollback()
    tx.basic_publish("", a, b"after")
    tx.tx_commit()
    assert get_within(observer, a)[1] == b"after"
    assert nothing_visible(observer, a) and nothing_visible(observer, b)


# -- transactional basic.ack --------------------------------------------------------------


def test_acks_apply_only_on_commit(
    connection: pika.BlockingConnection, observer: BlockingChannel
) -> None:
    q = name("ack")
    observer.queue_declare(q)
    for i in range(3):
        observer.basic_publish("", q, str(i).encode())
    tx = connection.channel()
    tx.tx_select()
    tags = [tx.basic_get(q)[0].delivery_tag for _ in range(3)]
    tx.basic_ack(tags[-1], multiple=True)
    tx.tx_rollback()
    tx.close()  # the rolled-back acks never applied: all three go back to the queue
    tx = connection.channel()
    tx.tx_select()
    methods = [get_within(tx, q, ack=False)[0] for _ in range(3)]
    assert all(m.redelivered for m in methods)
    tx.basic_ack(methods[0].delivery_tag)
    tx.basic_ack(methods[2].delivery_tag)
    tx.tx_commit()
    tx.close()  # the one not acked goes back; the two committed acks hold
    assert get_within(observer, q)[1] == b"1"
    assert nothing_visible(observer, q)


# -- transactional basic.reject / basic.nack ----------------------------------------------


def test_rejects_and_nacks_apply_only_on_commit(
    tx: BlockingChannel, observer: BlockingChannel
) -> None:
    q = name("rej")
    observer.queue_declare(q)
    for body in (b"requeue-me", b"drop-me", b"nack-me"):
        observer.basic_publish("", q, body)
    first, second, third = (tx.basic_get(q)[0] for _ in range(3))
    tx.basic_reject(first.delivery_tag, requeue=True)
    tx.basic_reject(second.delivery_tag, requeue=False)
    tx.basic_nack(third.delivery_tag, requeue=True)
    tx.queue_declare(q, passive=True)  # the settles above are handled by now
    assert nothing_visible(observer, q), "a reject applied before its commit"
    tx.tx_rollback()
    assert nothing_visible(observer, q), "a rolled-back reject requeued its message"
    tx.basic_reject(first.delivery_tag, requeue=True)  # still unacked: settle again
    tx.basic_reject(second.delivery_tag, requeue=False)
    tx.basic_nack(third.delivery_tag, requeue=True)
    tx.tx_commit()
    back = sorted(get_within(observer, q)[1] for _ in range(2))
    assert back == [b"nack-me", b"requeue-me"]
    assert nothing_visible(observer, q), "the message rejected without requeue came back"


# -- transactional exchange / queue / binding creation and deletion ----------------------


def test_declares_binds_and_deletes_are_not_transactional(
    tx: BlockingChannel, observer: BlockingChannel
) -> None:
    q, gone, exchange = name("res"), name("gone"), name("resx")
    observer.queue_declare(gone)
    tx.queue_declare(q)
    tx.exchange_declare(exchange, "direct")
    tx.queue_bind(q, exchange, "key")
    tx.queue_delete(gone)
    tx.tx_rollback()
    observer.queue_declare(q, passive=True)
    observer.exchange_declare(exchange, passive=True)
    observer.basic_publish(exchange, "key", b"routed")  # the binding held too
    assert get_within(observer, q)[1] == b"routed"
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        observer.queue_declare(gone, passive=True)
    assert info.value.reply_code == 404


# -- transactional consuming / getting ------------------------------------------------------


def test_no_ack_get_takes_the_message_only_on_commit(
    tx: BlockingChannel, observer: BlockingChannel
) -> None:
    q = name("get")
    observer.queue_declare(q)
    observer.basic_publish("", q, b"one")
    method, _props, body = tx.basic_get(q, auto_ack=True)
    assert method is not None and body == b"one"
    tx.tx_rollback()  # not taken: back in the queue at once
    method, body = get_within(tx, q)
    assert body == b"one" and method.redelivered
    tx.tx_commit()  # taken now
    tx.close()
    assert nothing_visible(observer, q)


def test_consumed_deliveries_are_not_requeued_by_a_rollback(
    connection: pika.BlockingConnection, observer: BlockingChannel
) -> None:
    q = name("cons")
    observer.queue_declare(q)
    observer.basic_publish("", q, b"kept")
    tx = connection.channel()
    tx.tx_select()
    seen: list[bytes] = []
    tx.basic_consume(q, lambda ch, method, props, body: seen.append(body))
    deadline = time.monotonic() + 15
    while not seen and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    assert seen == [b"kept"]
    tx.tx_rollback()  # consuming is not transactional: the delivery stays with the channel
    assert nothing_visible(observer, q)


# -- error detection ------------------------------------------------------------------------


def wait_closed(connection: pika.BlockingConnection, channel: BlockingChannel) -> None:
    deadline = time.monotonic() + 15
    while channel.is_open and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)


def test_errors_are_detected_at_the_call_not_at_commit(
    connection: pika.BlockingConnection, observer: BlockingChannel
) -> None:
    closed: list[tuple[int, str]] = []
    tx = connection.channel()
    # BlockingChannel has no close callback of its own: its underlying channel's.
    tx._impl.add_on_close_callback(
        lambda ch, reason: closed.append((reason.reply_code, reason.reply_text))
    )
    tx.tx_select()
    q = name("err")
    tx.queue_declare(q)
    tx.basic_publish("", q, b"never")
    tx.basic_publish(name("no-such-exchange"), "key", b"lost")
    wait_closed(connection, tx)  # no Tx.Commit sent: the publish alone closes the channel
    assert closed and closed[0][0] == 404 and "NOT_FOUND" in closed[0][1], closed
    assert nothing_visible(observer, q), "the transaction's other publish applied"

    tx = connection.channel()
    tx.tx_select()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        tx.basic_ack(99)
        tx.queue_declare(q, passive=True)
    assert info.value.reply_code == 406 and "unknown delivery tag" in info.value.reply_text


# -- basic.return of an unroutable mandatory publish ----------------------------------------


def test_unroutable_mandatory_publish_is_returned_at_the_publish(
    connection: pika.BlockingConnection,
) -> None:
    returned: list[tuple[int, bytes]] = []
    tx = connection.channel()
    tx.add_on_return_callback(
        lambda ch, method, props, body: returned.append((method.reply_code, body))
    )
    tx.tx_select()
    exchange = name("unbound")
    tx.exchange_declare(exchange, "direct")
    tx.basic_publish(exchange, "nowhere", b"back", mandatory=True)
    deadline = time.monotonic() + 15
    while not returned and time.monotonic() < deadline:  # no Tx.Commit sent
        connection.process_data_events(time_limit=0.1)
    assert returned == [(312, b"back")]
    tx.tx_commit()  # nothing else to apply: the commit still answers
    assert returned == [(312, b"back")]


# -- atomicity in a single queue, visibility and durability, across a broker SIGKILL ---------

INPUTS = 30


def read_generation(channel: BlockingChannel) -> tuple[int, list[int]]:
    """Take every message of queue ``one`` (unacked, on ``channel``): all must be of one
    generation, each index once; (that generation, the delivery tags). A delivery unacked
    when the broker was killed is back in the queue after the restart."""
    seen: dict[bytes, int] = {}
    while len(seen) < INPUTS:
        method, body = get_within(channel, "one", 30, ack=False)
        assert body not in seen, f"{body!r} twice: a commit applied in part"
        seen[body] = method.delivery_tag
    quiet_until = time.monotonic() + 1
    while time.monotonic() < quiet_until:
        extra = channel.basic_get("one")[0]
        assert extra is None, "more than one generation in the queue: a commit applied in part"
        time.sleep(0.1)
    generations = {body.split(b":")[0] for body in seen}
    assert len(generations) == 1, f"a mix of generations {generations}: a commit applied in part"
    assert sorted(int(body.split(b":")[1]) for body in seen) == list(range(INPUTS))
    return int(generations.pop().removeprefix(b"gen")), list(seen.values())


@pytest.mark.slow
def test_commit_is_all_or_nothing_in_one_queue_across_broker_kills(tmp_path: Path) -> None:
    """Each transaction takes every input of one queue (acks them) and publishes the next
    generation to the same queue; the broker is SIGKILLed while a commit is under way,
    twice. After each restart the queue holds one whole generation, never a mix, and the
    next one whenever Commit-Ok had arrived."""
    server = ServerProcess(
        tmp_path / "data",
        settings=("store.flush=sync",),
    ).start()
    url = f"amqp://guest:guest@{server.amqp_address}/%2F"
    rng = random.Random(5)
    try:
        conn = connect(url)
        ch = conn.channel()
        ch.queue_declare("one", durable=True)
        ch.confirm_delivery()
        for i in range(INPUTS):
            ch.basic_publish("", "one", b"gen0:%d" % i, pika.BasicProperties(delivery_mode=2))
        conn.close()
        outcomes = []
        allowed = {0}
        # One kill soon after Tx.Commit is sent, one later: before and after the commit point.
        for delay in (rng.uniform(0.0, 0.01), rng.uniform(0.02, 0.2)):
            conn = connect(url)
            ch = conn.channel()
            ch.tx_select()
            generation, tags = read_generation(ch)
            assert generation in allowed, (generation, allowed, outcomes)
            ch.tx_commit()  # nothing registered yet: an empty transaction
            for i in range(INPUTS):
                ch.basic_publish(
                    "", "one", b"gen%d:%d" % (generation + 1, i),
                    pika.BasicProperties(delivery_mode=2),
                )  # fmt: skip
            ch.basic_ack(max(tags), multiple=True)
            killer = threading.Timer(delay, server.kill)
            killer.start()
            try:
                ch.tx_commit()
                outcomes.append("committed")
                allowed = {generation + 1}  # Commit-Ok came: the next generation is there
            except (pika.exceptions.AMQPError, OSError):
                outcomes.append("unknown")
                allowed = {generation, generation + 1}
            killer.join()
            server.start()
        conn = connect(url)
        generation, _tags = read_generation(conn.channel())
        assert generation in allowed, (generation, allowed, outcomes)
        conn.close()
        print(f"\ncommits under a kill: {outcomes}, generation {generation} at the end")
    finally:
        server.kill()


# -- fencing: an ack whose delivery timed out and went to another consumer ------------------


@pytest.mark.slow
def test_a_late_ack_is_fenced_at_commit_and_nothing_of_its_transaction_applies(
    tmp_path: Path,
) -> None:
    server = ServerProcess(
        tmp_path / "data",
        settings=(
            "broker.min_receive_invisible_ms=1s",
            "server.amqp_consumer_timeout=1s",
        ),
    ).start()
    url = f"amqp://guest:guest@{server.amqp_address}/%2F"
    try:
        slow, fast = connect(url), connect(url)
        observer = fast.channel()
        observer.queue_declare("in")
        observer.queue_declare("out")
        observer.basic_publish("", "in", b"work")
        tx = slow.channel()
        tx.tx_select()
        method, body = get_within(tx, "in", ack=False)
        assert body == b"work"
        tx.basic_publish("", "out", b"result")
        tx.basic_ack(method.delivery_tag)
        # Past its consumer timeout the delivery goes to another consumer, which acks it.
        again, body = get_within(observer, "in", ack=False)
        assert body == b"work" and again.redelivered
        observer.basic_ack(again.delivery_tag)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            tx.tx_commit()
        assert info.value.reply_code == 406 and "rolled back" in info.value.reply_text
        assert nothing_visible(observer, "out"), "the fenced transaction's publish applied"
        assert nothing_visible(observer, "in")
        slow.close()
        fast.close()
    finally:
        server.kill()


# -- the table ---------------------------------------------------------------------------------

TABLE_HEADER = "| | AMQP 0-9-1 | RabbitMQ (≥ 2.8) | RocketMQ 5 | Kafka | halfmoon | halfmoon AMQP |"


def test_every_test_the_table_names_exists() -> None:
    """Each halfmoon AMQP cell of docs/transactions.md names tests that exist."""
    doc = (ROOT / "docs" / "transactions.md").read_text()
    start = doc.index(TABLE_HEADER)
    rows = doc[start:].split("\n\n", 1)[0].splitlines()[2:]
    assert len(rows) >= 10, rows
    for row in rows:
        cell = row.strip().strip("|").split("|")[-1]
        names = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", cell)
        assert names, f"a halfmoon AMQP cell names no test: {row}"
        for path, test in names:
            source = (ROOT / path).read_text()
            assert re.search(rf"^(async )?def {test}\(", source, re.M), f"{path}::{test} is gone"


def test_x_delay_inside_a_transaction_holds_the_message_past_the_commit(
    tx: BlockingChannel, observer: BlockingChannel
) -> None:
    """Not before the commit, and not before its delay from the publish: then delivered once,
    not marked redelivered."""
    q = name("tx-delayed")
    tx.queue_declare(q)
    published = time.monotonic()
    tx.basic_publish("", q, b"later", pika.BasicProperties(headers={"x-delay": 5000}))
    tx.basic_publish("", q, b"now")
    assert nothing_visible(observer, q)
    tx.tx_commit()
    method, body = get_within(observer, q)
    assert body == b"now"
    assert nothing_visible(observer, q)  # committed, in its queue, not yet due
    method, body = get_within(observer, q)
    assert body == b"later" and not method.redelivered
    assert time.monotonic() - published >= 4.9
