"""The inbox: idempotent consumers over an at-least-once broker.

A consumer may see a message twice (a redelivery after a crash before the
ack, a relay that republished, a retried send). The inbox makes the
*effects* happen once: it inserts ``(consumer, idempotency key)`` into a
dedupe table in the same database transaction as the handler's effects.
The first delivery inserts the row and runs the handler; a later delivery
finds the row and skips the handler; a delivery whose transaction rolled
back left no row, so the next one runs it again.

Concurrent deliveries of one key are safe: the second insert waits on the
first's uncommitted row (PostgreSQL, InnoDB) or on the write lock (SQLite),
then finds the row and skips.

One line for the user, as a decorator::

    @inbox.handler(engine, key=lambda message: message.message_id)
    def deduct_stock(conn, message): ...

    deduct_stock(message)   # the handler's result, or DUPLICATE

or as a context manager around code that already has its transaction::

    with inbox.once(conn, message.message_id) as fresh:
        if fresh:
            ...

Rows older than ``retention`` are deleted by :meth:`Inbox.cleanup` in
bounded batches; a redelivery later than that would run again, so keep the
window longer than the broker's longest redelivery (retries, DLQ replays).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, ParamSpec, TypeVar

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Index,
    MetaData,
    String,
    Table,
    delete,
    insert,
    select,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import Insert

P = ParamSpec("P")
R = TypeVar("R")


class _Duplicate:
    """The result of a handler call skipped because its key was already processed."""

    _instance: _Duplicate | None = None

    def __new__(cls) -> _Duplicate:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "DUPLICATE"

    def __bool__(self) -> bool:
        return False


DUPLICATE: Final = _Duplicate()


def backend(bind: Engine | Connection) -> str:
    """``sqlite``, ``postgresql`` or ``mysql`` (MariaDB included)."""
    name = bind.dialect.name
    return "mysql" if name == "mariadb" else name


def insert_if_absent(conn: Connection, table: Table, values: Mapping[str, Any]) -> bool:
    """Insert ``values`` unless a row with the same primary key exists; True if inserted.

    Contends for the key: when another transaction inserted it and is still
    open, this waits for it (under the session's lock timeout) rather than
    answering early. Never raises on the duplicate itself.
    """
    kind = backend(conn)
    if kind == "postgresql":
        # RETURNING says it plainly; psycopg's rowcount for DO NOTHING is not to be relied on.
        first_key = next(iter(table.primary_key.columns))
        returning = pg_insert(table).values(**values).on_conflict_do_nothing().returning(first_key)
        return conn.execute(returning).first() is not None
    elif kind == "mysql":
        stmt: Insert = insert(table).values(**values).prefix_with("IGNORE")
    elif kind == "sqlite":
        stmt = insert(table).values(**values).prefix_with("OR IGNORE")
    else:
        raise NotImplementedError(
            f"no insert-if-absent for database {kind!r} (SQLite, PostgreSQL and MariaDB/MySQL are "
            "supported)"
        )
    return conn.execute(stmt).rowcount == 1


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Delivery:
    """What :meth:`Inbox.once` yields: truthy on the first delivery of its key."""

    conn: Connection
    key: str
    fresh: bool

    def __bool__(self) -> bool:
        return self.fresh


class Inbox:
    """The dedupe table ``<prefix>inbox`` for one consumer name.

    Many consumers share the table; each :class:`Inbox` reads and writes its
    own ``consumer`` rows only.
    """

    def __init__(
        self,
        consumer: str,
        *,
        table_prefix: str = "hm_",
        metadata: MetaData | None = None,
        retention: timedelta = timedelta(days=7),
    ) -> None:
        if not consumer:
            raise ValueError("an inbox needs a consumer name (it scopes the idempotency keys)")
        if not table_prefix.replace("_", "").isalnum():
            raise ValueError(
                f"table prefix {table_prefix!r} must be letters, digits and underscores"
            )
        self.consumer = consumer
        self.retention = retention
        self.metadata = metadata if metadata is not None else MetaData()
        name = f"{table_prefix}inbox"
        existing = self.metadata.tables.get(name)
        self.table = existing if existing is not None else Table(
            name,
            self.metadata,
            Column("consumer", String(200), primary_key=True),
            Column("idempotency_key", String(255), primary_key=True),
            Column("processed_at", BigInteger, nullable=False),
            Index(f"{table_prefix}inbox_age", "processed_at"),
        )  # fmt: skip

    def create(self, bind: Engine | Connection) -> None:
        self.metadata.create_all(bind, tables=[self.table])

    def drop(self, bind: Engine | Connection) -> None:
        self.metadata.drop_all(bind, tables=[self.table])

    def claim(self, conn: Connection, key: str) -> bool:
        """Record ``key`` as processed in ``conn``'s transaction; False if it already was."""
        if not key:
            raise ValueError("an empty idempotency key cannot deduplicate anything")
        return insert_if_absent(
            conn,
            self.table,
            {"consumer": self.consumer, "idempotency_key": key, "processed_at": _now_ms()},
        )

    def seen(self, conn: Connection, key: str) -> bool:
        """Whether ``key`` was processed (committed) by this consumer."""
        t = self.table
        return (
            conn.execute(
                select(t.c.idempotency_key).where(
                    t.c.consumer == self.consumer, t.c.idempotency_key == key
                )
            ).first()
            is not None
        )

    @contextlib.contextmanager
    def once(self, bind: Engine | Connection, key: str) -> Iterator[Delivery]:
        """Claim ``key`` and yield a :class:`Delivery` (truthy the first time).

        With an Engine, the block runs in a transaction of its own, committed
        at the end (rolled back, claim included, on an exception). With a
        Connection, the claim joins the caller's transaction and the caller
        commits.
        """
        if isinstance(bind, Engine):
            with bind.begin() as conn:
                yield Delivery(conn, key, self.claim(conn, key))
            return
        yield Delivery(bind, key, self.claim(bind, key))

    def handler(
        self, bind: Engine, *, key: Callable[..., str]
    ) -> Callable[[Callable[..., R]], Callable[..., R | _Duplicate]]:
        """Decorate ``fn(conn, *args)`` to run once per ``key(*args)``; callers pass ``*args``.

        The decorated function returns ``fn``'s result, or :data:`DUPLICATE`
        when the key was already processed (the handler did not run).
        """

        def decorate(fn: Callable[..., R]) -> Callable[..., R | _Duplicate]:
            @functools.wraps(fn)
            def run(*args: Any, **kwargs: Any) -> R | _Duplicate:
                with self.once(bind, key(*args, **kwargs)) as delivery:
                    if not delivery:
                        return DUPLICATE
                    return fn(delivery.conn, *args, **kwargs)

            return run

        return decorate

    def cleanup(
        self,
        engine: Engine,
        *,
        older_than: timedelta | None = None,
        batch_size: int = 1000,
        max_batches: int | None = None,
    ) -> int:
        """Delete this consumer's rows older than ``older_than`` (default: ``retention``); the
        count."""
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        window = self.retention if older_than is None else older_than
        cutoff = _now_ms() - int(window.total_seconds() * 1000)
        t = self.table
        deleted = batches = 0
        while max_batches is None or batches < max_batches:
            with engine.begin() as conn:
                keys = (
                    conn.execute(
                        select(t.c.idempotency_key)
                        .where(t.c.consumer == self.consumer, t.c.processed_at < cutoff)
                        .order_by(t.c.processed_at)
                        .limit(batch_size)
                    )
                    .scalars()
                    .all()
                )
                if not keys:
                    break
                deleted += conn.execute(
                    delete(t).where(t.c.consumer == self.consumer, t.c.idempotency_key.in_(keys))
                ).rowcount
            batches += 1
            if len(keys) < batch_size:
                break
        return deleted
