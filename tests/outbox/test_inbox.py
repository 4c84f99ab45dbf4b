"""The inbox: a redelivered message has no second effect, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import Column, Engine, Integer, String, Table, insert, select, update

from halfmoon.client import ConsumeResult, Message, MessageSelector, SyncProducer, SyncPushConsumer
from halfmoon.outbox.inbox import DUPLICATE, Inbox
from tests.outbox import toolkit_support
from tests.server.conftest import ServerProcess, server

engine, prefix = toolkit_support.engine, toolkit_support.prefix
__all__ = ["server"]


def make(engine: Engine, prefix: str, consumer: str = "inventory") -> tuple[Inbox, Table]:
    inbox = Inbox(consumer, table_prefix=prefix)
    stock = Table(
        f"{prefix}stock",
        inbox.metadata,
        Column("sku", String(32), primary_key=True),
        Column("qty", Integer, nullable=False),
    )
    inbox.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(stock).values(sku="apple", qty=10))
    return inbox, stock


def qty(engine: Engine, stock: Table) -> int:
    with engine.connect() as conn:
        return conn.execute(select(stock.c.qty).where(stock.c.sku == "apple")).scalar_one()


def test_redelivered_message_has_no_second_effect(
    engine: Engine, prefix: str, server: ServerProcess
) -> None:
    inbox, stock = make(engine, prefix)
    topic, group = f"{prefix}orders", f"{prefix}inventory"
    server.create_topic(topic)
    server.create_group(group, retry_policy={"kind": "customized", "levels_ms": [100]})
    calls: list[str] = []

    @inbox.handler(engine, key=lambda message: message.message_id)
    def deduct(conn, message):
        calls.append(message.message_id)
        conn.execute(
            update(stock).where(stock.c.sku == "apple").values(qty=stock.c.qty - int(message.body))
        )
        return "deducted"

    results: list[object] = []
    two_deliveries = threading.Event()

    def listener(message):
        results.append(deduct(message))
        if len(results) == 1:
            # The effect committed but the ack never happened (a crash, a lost ack):
            # the broker delivers the message again.
            return ConsumeResult.LATER
        two_deliveries.set()
        return ConsumeResult.SUCCESS

    try:
        with (
            SyncProducer(server.grpc) as producer,
            SyncPushConsumer(server.grpc, group, {topic: MessageSelector.all()}, listener),
        ):
            sent = producer.send(Message(topic, b"3"))
            assert two_deliveries.wait(20), f"no redelivery; results so far {results}"
        assert results == ["deducted", DUPLICATE]
        assert calls == [sent.message_id]
        assert qty(engine, stock) == 7
    finally:
        inbox.metadata.drop_all(engine)


def test_rolled_back_handler_runs_again_and_consumers_are_separate(
    engine: Engine, prefix: str
) -> None:
    inbox, stock = make(engine, prefix)
    other = Inbox("billing", table_prefix=prefix, metadata=inbox.metadata)
    try:
        with pytest.raises(RuntimeError), inbox.once(engine, "m1") as delivery:
            assert delivery
            delivery.conn.execute(update(stock).values(qty=0))
            raise RuntimeError("handler failed mid-way")
        assert qty(engine, stock) == 10  # effect and claim rolled back together
        with inbox.once(engine, "m1") as delivery:
            assert delivery.fresh
            delivery.conn.execute(update(stock).values(qty=stock.c.qty - 1))
        with inbox.once(engine, "m1") as delivery:
            assert not delivery
        with engine.begin() as conn:  # a caller-owned transaction
            with inbox.once(conn, "m1") as delivery:
                assert not delivery
            with other.once(conn, "m1") as delivery:
                assert delivery  # the key is scoped by consumer name
        assert qty(engine, stock) == 9
        with engine.connect() as conn:
            assert inbox.seen(conn, "m1") and other.seen(conn, "m1") and not inbox.seen(conn, "m2")
    finally:
        inbox.metadata.drop_all(engine)


def test_concurrent_duplicate_waits_for_the_first_then_skips(engine: Engine, prefix: str) -> None:
    inbox, stock = make(engine, prefix)
    try:
        second: list[bool] = []
        done = threading.Event()
        with engine.connect() as first:
            assert inbox.claim(first, "dup")  # first delivery, transaction still open
            first.execute(update(stock).values(qty=stock.c.qty - 1))

            def deliver_again() -> None:
                with inbox.once(engine, "dup") as delivery:
                    second.append(delivery.fresh)
                    if delivery:
                        delivery.conn.execute(update(stock).values(qty=stock.c.qty - 1))
                done.set()

            thread = threading.Thread(target=deliver_again)
            thread.start()
            assert not done.wait(0.7), "the duplicate did not wait for the open first delivery"
            first.commit()
        assert done.wait(20)
        thread.join()
        assert second == [False]
        assert qty(engine, stock) == 9
    finally:
        inbox.metadata.drop_all(engine)


def test_cleanup_after_the_window_in_batches(engine: Engine, prefix: str) -> None:
    inbox, _ = make(engine, prefix)
    inbox.retention = timedelta(hours=1)
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(inbox.table),
                [
                    {
                        "consumer": "inventory",
                        "idempotency_key": f"old{i}",
                        "processed_at": 1000 + i,
                    }
                    for i in range(7)
                ],
            )
            conn.execute(
                insert(inbox.table).values(
                    consumer="other", idempotency_key="old", processed_at=1000
                )
            )
            inbox.claim(conn, "fresh")
        assert inbox.cleanup(engine, batch_size=3, max_batches=1) == 3
        assert inbox.cleanup(engine, batch_size=3) == 4
        with engine.connect() as conn:
            left = conn.execute(
                select(inbox.table.c.consumer, inbox.table.c.idempotency_key).order_by(
                    inbox.table.c.consumer
                )
            ).all()
        assert [tuple(r) for r in left] == [("inventory", "fresh"), ("other", "old")]
    finally:
        inbox.metadata.drop_all(engine)
