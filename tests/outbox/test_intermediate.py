"""RabbitMQ's intermediate-queue pattern on SQLite, PostgreSQL and MariaDB with a real RabbitMQ."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select

from halfmoon.outbox import IntermediateMover, IntermediatePublisher, Outbox
from tests.outbox.conftest import wait_until
from tests.outbox.test_rabbit_target import Queue


@pytest.fixture
def setup(
    outbox: Outbox, amqp_url: str
) -> Iterator[tuple[Outbox, IntermediatePublisher, IntermediateMover, Queue]]:
    destination = Queue(amqp_url)
    parking = f"hm-intermediate-{uuid.uuid4().hex[:10]}"
    publisher = IntermediatePublisher(amqp_url, table_prefix=outbox.tables.prefix, queue=parking)
    mover = IntermediateMover(
        outbox.engine, amqp_url, table_prefix=outbox.tables.prefix, queue=parking, lock_timeout=20
    )
    try:
        yield outbox, publisher, mover, destination
    finally:
        mover.stop()
        publisher.close()
        destination.delete()
        cleanup = Queue.__new__(Queue)
        cleanup.url, cleanup.name = amqp_url, parking
        cleanup.delete()


def ids_in_table(outbox: Outbox) -> int:
    with outbox.engine.connect() as conn:
        return conn.execute(
            select(func.count()).select_from(outbox.tables.intermediate)
        ).scalar_one()


def test_committed_message_is_forwarded_and_its_id_forgotten(setup) -> None:  # noqa: ANN001
    outbox, publisher, mover, destination = setup
    with outbox.engine.begin() as conn:
        key = publisher.publish(
            conn, exchange="", routing_key=destination.name, body=b"order 1", headers={"trace": "x"}
        )
    mover.start()
    wait_until(lambda: mover.stats.forwarded == 1, 20, "the mover to forward the committed message")
    (message,) = destination.drain()
    assert (
        message.message_id == key and message.body == b"order 1" and message.headers["trace"] == "x"
    )
    assert "halfmoon-exchange" not in message.headers
    assert ids_in_table(outbox) == 0


def test_rolled_back_message_is_dropped(setup) -> None:  # noqa: ANN001
    outbox, publisher, mover, destination = setup
    with pytest.raises(RuntimeError), outbox.engine.begin() as conn:
        publisher.publish(conn, exchange="", routing_key=destination.name, body=b"never")
        raise RuntimeError("business rule failed after the publish")
    with outbox.engine.begin() as conn:
        kept = publisher.publish(conn, exchange="", routing_key=destination.name, body=b"kept")
    mover.start()
    wait_until(
        lambda: mover.stats.dropped == 1 and mover.stats.forwarded == 1,
        20,
        "the mover to decide both",
    )
    assert [m.message_id for m in destination.drain()] == [kept]
    assert ids_in_table(outbox) == 0


def test_mover_waits_for_an_open_transaction_then_forwards(setup) -> None:  # noqa: ANN001
    outbox, publisher, mover, destination = setup
    with outbox.engine.connect() as conn:
        tx = conn.begin()
        key = publisher.publish(
            conn, exchange="", routing_key=destination.name, body=b"slow commit"
        )
        mover.start()
        wait_until(lambda: mover.stats.examined == 1, 20, "the mover to pick the message up")
        # The writer is still open: the mover must neither forward nor drop yet.
        assert mover.stats.forwarded == 0 and mover.stats.dropped == 0
        assert destination.drain() == []
        tx.commit()
    wait_until(lambda: mover.stats.forwarded == 1, 20, "the forward after the commit")
    assert mover.stats.dropped == 0
    assert [m.message_id for m in destination.drain()] == [key]


def test_mover_waits_for_an_open_transaction_that_rolls_back(setup) -> None:  # noqa: ANN001
    outbox, publisher, mover, destination = setup
    with outbox.engine.connect() as conn:
        tx = conn.begin()
        publisher.publish(conn, exchange="", routing_key=destination.name, body=b"abandoned")
        mover.start()
        wait_until(lambda: mover.stats.examined == 1, 20, "the mover to pick the message up")
        assert mover.stats.dropped == 0
        tx.rollback()
    wait_until(lambda: mover.stats.dropped == 1, 20, "the drop after the rollback")
    assert mover.stats.forwarded == 0 and destination.drain() == []
