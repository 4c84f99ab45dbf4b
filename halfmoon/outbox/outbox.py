"""The outbox: write a message row inside the business transaction.

    outbox = Outbox("postgresql+psycopg://app@db/app")
    outbox.create_tables()
    with engine.begin() as conn:                       # or an ORM Session
        conn.execute(orders.insert().values(...))
        outbox.add(conn, OutboxMessage(topic="orders", payload=b"...",
                                       aggregate_type="order", aggregate_id="42"))

The row commits or rolls back with the business rows; a :class:`~halfmoon.outbox.relay.Relay`
publishes it afterwards. Messages of one aggregate (``aggregate_type``,
``aggregate_id``) are published in the order of their ids, which is the
order the transactions that wrote them inserted them: when two transactions
write the same aggregate concurrently without holding it (the usual update of
the aggregate's own row serialises them), their relative order is whichever
inserted first.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, func, select, update
from sqlalchemy.orm import Session

from halfmoon.outbox import dialects
from halfmoon.outbox.errors import InvalidOutboxMessage
from halfmoon.outbox.schema import FAILED, PENDING, SENT, OutboxTables, outbox_tables


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class OutboxMessage:
    """One message to publish after commit.

    ``topic`` is a halfmoon topic or a RabbitMQ exchange (``""``: the default
    exchange, where ``routing_key`` names the queue). ``keys`` become halfmoon
    message keys; ``message_group`` a halfmoon FIFO group. ``headers`` are
    string properties (halfmoon) or AMQP headers. ``message_id`` is generated
    when empty and travels with the message: it is the consumer's idempotency key.
    """

    topic: str
    payload: bytes
    aggregate_type: str = ""
    aggregate_id: str = ""
    routing_key: str = ""
    keys: list[str] = field(default_factory=list)
    tag: str | None = None
    message_group: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    message_id: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.payload, str):
            self.payload = self.payload.encode()
        if isinstance(self.keys, str):
            self.keys = [self.keys]
        if not self.payload:
            # A broker takes no empty body (halfmoon answers BAD_REQUEST): refused here, in
            # the caller's transaction, rather than parked by the relay after the commit.
            raise InvalidOutboxMessage(
                f"outbox message for topic {self.topic!r} has an empty payload; "
                "a message needs a body of at least one byte"
            )
        if not isinstance(self.topic, str):
            raise InvalidOutboxMessage(
                "outbox message topic must be a string (a halfmoon topic or RabbitMQ exchange)"
            )
        if not self.message_id:
            self.message_id = uuid.uuid4().hex


@dataclass(frozen=True)
class OutboxRecord:
    """A stored outbox row, as the relay hands it to a target."""

    id: int
    message_id: str
    aggregate_type: str
    aggregate_id: str
    topic: str
    routing_key: str
    keys: list[str]
    tag: str | None
    message_group: str | None
    headers: dict[str, str]
    payload: bytes
    attempts: int
    created_at: int

    @classmethod
    def from_row(cls, row: Any) -> OutboxRecord:
        return cls(
            id=row.id,
            message_id=row.message_id,
            aggregate_type=row.aggregate_type,
            aggregate_id=row.aggregate_id,
            topic=row.topic,
            routing_key=row.routing_key or "",
            keys=json.loads(row.keys) if row.keys else [],
            tag=row.tag,
            message_group=row.message_group,
            headers=json.loads(row.headers) if row.headers else {},
            payload=bytes(row.payload),
            attempts=row.attempts,
            created_at=row.created_at,
        )


@dataclass(frozen=True)
class OutboxStatus:
    """Counts per status and the age of the oldest pending row (seconds, 0 when none)."""

    pending: int
    sent: int
    failed: int
    oldest_pending_age: float


Executor = Connection | Session


class Outbox:
    """The outbox tables of one database and ``table_prefix``."""

    def __init__(self, engine_or_url: Engine | str, *, table_prefix: str = "hm_") -> None:
        self.engine = (
            dialects.make_engine(engine_or_url) if isinstance(engine_or_url, str) else engine_or_url
        )
        self.tables: OutboxTables = outbox_tables(table_prefix)
        self.table = self.tables.outbox

    @property
    def backend(self) -> str:
        return dialects.backend(self.engine)

    def create_tables(self) -> None:
        """Create the outbox tables (and, on PostgreSQL, the NOTIFY trigger) if missing."""
        with self.engine.begin() as conn:
            self.tables.metadata.create_all(conn, checkfirst=True)
            if self.backend == "postgresql":
                dialects.install_notify_trigger(conn, self.tables)

    def drop_tables(self) -> None:
        """Drop the outbox tables (tests, uninstall)."""
        with self.engine.begin() as conn:
            if self.backend == "postgresql":
                dialects.drop_notify_trigger(conn, self.tables)
            self.tables.metadata.drop_all(conn, checkfirst=True)

    def add(self, connection_or_session: Executor, message: OutboxMessage) -> str:
        """Write ``message`` in the caller's open transaction; returns its ``message_id``."""
        self.add_many(connection_or_session, [message])
        return message.message_id

    def add_many(
        self, connection_or_session: Executor, messages: Iterable[OutboxMessage]
    ) -> list[str]:
        """Write several messages (one INSERT) in the caller's transaction, in the given order."""
        rows = [self._row(m) for m in messages]
        if rows:
            connection_or_session.execute(self.table.insert(), rows)
        return [r["message_id"] for r in rows]

    def _row(self, message: OutboxMessage) -> dict[str, Any]:
        if not isinstance(message, OutboxMessage):
            raise InvalidOutboxMessage(f"expected an OutboxMessage, got {type(message).__name__}")
        created = now_ms()
        return {
            "message_id": message.message_id,
            "aggregate_type": message.aggregate_type,
            "aggregate_id": message.aggregate_id,
            "topic": message.topic,
            "routing_key": message.routing_key,
            "keys": json.dumps(list(message.keys)) if message.keys else None,
            "tag": message.tag,
            "message_group": message.message_group,
            "headers": json.dumps(_string_map(message.headers)) if message.headers else None,
            "payload": message.payload,
            "status": PENDING,
            "attempts": 0,
            "next_attempt_at": created,
            "created_at": created,
        }

    # -- inspection and operations --------------------------------------------------------

    def status(self) -> OutboxStatus:
        t = self.table
        with self.engine.connect() as conn:
            counts: dict[str, int] = dict(
                conn.execute(select(t.c.status, func.count()).group_by(t.c.status)).all()
            )
            oldest = conn.execute(
                select(func.min(t.c.created_at)).where(t.c.status == PENDING)
            ).scalar()
        age = max(now_ms() - oldest, 0) / 1000 if oldest is not None else 0.0
        return OutboxStatus(counts.get(PENDING, 0), counts.get(SENT, 0), counts.get(FAILED, 0), age)

    def failed_messages(self, limit: int = 100) -> list[dict[str, Any]]:
        """The failed (parked) rows, oldest first: what held each back and why."""
        t = self.table
        columns = (
            t.c.message_id, t.c.aggregate_type, t.c.aggregate_id, t.c.topic,
            t.c.attempts, t.c.created_at, t.c.last_error,
        )  # fmt: skip
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(*columns).where(t.c.status == FAILED).order_by(t.c.id).limit(limit)
            ).all()
        return [dict(row._mapping) for row in rows]

    def retry_failed(self, message_ids: Iterable[str] | None = None) -> int:
        """Put failed rows back to pending (all, or the given ones); returns how many."""
        t = self.table
        stmt = update(t).where(t.c.status == FAILED)
        if message_ids is not None:
            stmt = stmt.where(t.c.message_id.in_(list(message_ids)))
        with self.engine.begin() as conn:
            return conn.execute(
                stmt.values(status=PENDING, attempts=0, next_attempt_at=now_ms())
            ).rowcount


def _string_map(headers: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in headers.items():
        if not isinstance(key, str):
            raise InvalidOutboxMessage(f"header names must be strings, got {key!r}")
        out[key] = value if isinstance(value, str) else str(value)
    return out
