"""The outbox table and ``Outbox.add`` inside the caller's transaction."""

from __future__ import annotations

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, inspect, select
from sqlalchemy.orm import Session

from halfmoon.outbox import InvalidOutboxMessage, Outbox, OutboxMessage, OutboxRecord


def test_add_commits_with_the_business_transaction(outbox: Outbox) -> None:
    with outbox.engine.begin() as conn:
        mid = outbox.add(
            conn,
            OutboxMessage(
                "orders",
                b"\x00\x01payload",
                aggregate_type="order",
                aggregate_id="42",
                keys=["o-42"],
                tag="created",
                headers={"trace": "abc", "n": 7},
            ),
        )
    with outbox.engine.connect() as conn:
        row = conn.execute(select(outbox.table)).one()
    record = OutboxRecord.from_row(row)
    assert record.message_id == mid
    assert record.payload == b"\x00\x01payload"
    assert record.headers == {"trace": "abc", "n": "7"}
    assert (record.aggregate_type, record.aggregate_id, record.keys, record.tag) == (
        "order",
        "42",
        ["o-42"],
        "created",
    )
    assert row.status == "pending" and row.attempts == 0 and row.next_attempt_at == row.created_at
    assert outbox.status().pending == 1


def test_rollback_leaves_no_row(outbox: Outbox) -> None:
    with pytest.raises(RuntimeError), outbox.engine.begin() as conn:
        outbox.add(conn, OutboxMessage("orders", b"x"))
        raise RuntimeError("business rule failed")
    assert outbox.status().pending == 0


def test_add_through_an_orm_session_with_business_rows(outbox: Outbox, table_prefix: str) -> None:
    metadata = MetaData()
    orders = Table(
        f"{table_prefix}orders",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("state", String(20)),
    )
    metadata.create_all(outbox.engine)
    try:
        with Session(outbox.engine) as session, session.begin():
            session.execute(orders.insert().values(id=1, state="new"))
            outbox.add(
                session, OutboxMessage("orders", b"1", aggregate_type="order", aggregate_id="1")
            )
        with Session(outbox.engine) as session:
            session.begin()
            session.execute(orders.insert().values(id=2, state="new"))
            outbox.add(
                session, OutboxMessage("orders", b"2", aggregate_type="order", aggregate_id="2")
            )
            session.rollback()
        with outbox.engine.connect() as conn:
            assert conn.execute(select(orders.c.id)).scalars().all() == [1]
            assert [r.aggregate_id for r in conn.execute(select(outbox.table))] == ["1"]
    finally:
        metadata.drop_all(outbox.engine)


def test_add_many_keeps_order_and_large_payloads(outbox: Outbox) -> None:
    big = bytes(range(256)) * 1024  # 256 KiB: above MariaDB's plain BLOB
    with outbox.engine.begin() as conn:
        ids = outbox.add_many(
            conn, [OutboxMessage("t", big if i == 0 else b"s", aggregate_id="a") for i in range(5)]
        )
    with outbox.engine.connect() as conn:
        rows = conn.execute(select(outbox.table).order_by(outbox.table.c.id)).all()
    assert [r.message_id for r in rows] == ids
    assert bytes(rows[0].payload) == big


def test_create_tables_is_idempotent_and_indexes_the_claim(outbox: Outbox) -> None:
    outbox.create_tables()
    names = {ix["name"] for ix in inspect(outbox.engine).get_indexes(outbox.table.name)}
    prefix = outbox.tables.prefix
    assert {
        f"{prefix}outbox_claim",
        f"{prefix}outbox_aggregate",
        f"{prefix}outbox_cleanup",
    } <= names


def test_a_non_message_is_refused(outbox: Outbox) -> None:
    with pytest.raises(InvalidOutboxMessage) as info, outbox.engine.begin() as conn:
        outbox.add(conn, {"topic": "t"})  # type: ignore[arg-type]
    assert info.value.code == "OUTBOX_INVALID_MESSAGE"


def test_retry_failed_puts_rows_back(outbox: Outbox) -> None:
    with outbox.engine.begin() as conn:
        mid = outbox.add(conn, OutboxMessage("t", b"x"))
        conn.execute(outbox.table.update().values(status="failed", attempts=9))
    assert outbox.status().failed == 1
    assert outbox.retry_failed([mid]) == 1
    status = outbox.status()
    assert (status.pending, status.failed) == (1, 0)
