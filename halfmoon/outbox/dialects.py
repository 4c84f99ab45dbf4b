"""What differs between SQLite, PostgreSQL and MariaDB: engines, claims, wake-ups.

Claiming a batch (the relay's hot path) comes in two kinds:

- **row locks** (PostgreSQL, MariaDB >= 10.6, MySQL >= 8): one transaction
  ``SELECT ... FOR UPDATE SKIP LOCKED``s the batch, publishes it and marks it
  in the same transaction. Another worker skips locked rows instead of
  waiting; a worker that dies releases its locks with its connection, so its
  rows are simply claimable again (published at least once).
- **leases** (SQLite, which has no row locks): one ``UPDATE`` stamps the batch
  with the worker's id and an expiry; the marks come in a later transaction.
  A dead worker's rows come back when the lease expires.

Both claim only the *head* of each aggregate: a pending row with no older
pending (or, by default, failed) row of the same aggregate. While a worker
holds an aggregate's head, every other worker sees that head as pending and
so cannot take the next row: one aggregate's messages are published one after
the other, in id order, however many workers and processes run. The price is
one message per aggregate per claim; many aggregates still fill a batch.

MariaDB runs the claim at READ COMMITTED: at REPEATABLE READ the locking scan
would take gap locks and make the application's inserts wait for publishes.
"""

from __future__ import annotations

import contextlib
import logging
import select as _select
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import (
    Connection,
    Engine,
    create_engine,
    event,
    exists,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Row
from sqlalchemy.engine.url import make_url
from sqlalchemy.sql.dml import Insert

from halfmoon.outbox.errors import UnsupportedDatabase
from halfmoon.outbox.schema import FAILED, PENDING, SENT, OutboxTables

log = logging.getLogger("halfmoon.outbox")

SQLITE_BUSY_TIMEOUT = 30.0


def make_engine(url: str, *, pool_size: int = 5) -> Engine:
    """An engine configured for the outbox: SQLite in WAL mode with a busy timeout."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(
            url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT, "check_same_thread": False}
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            if parsed.database not in (None, "", ":memory:"):
                cursor.execute("PRAGMA journal_mode=WAL")  # readers do not wait for the writer
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        return engine
    return create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def backend(engine_or_conn: Engine | Connection) -> str:
    """``sqlite``, ``postgresql`` or ``mysql`` (MariaDB included)."""
    return engine_or_conn.dialect.name if engine_or_conn.dialect.name != "mariadb" else "mysql"


def check_skip_locked(conn: Connection) -> None:
    """Refuse a MariaDB/MySQL server that has no ``SKIP LOCKED``."""
    if backend(conn) != "mysql":
        return
    version = conn.dialect.server_version_info or ()
    mariadb = bool(getattr(conn.dialect, "is_mariadb", False))
    needed = (10, 6) if mariadb else (8, 0)
    if tuple(version[:2]) < needed:
        name = "MariaDB" if mariadb else "MySQL"
        shown = ".".join(str(v) for v in version)
        raise UnsupportedDatabase(
            f"{name} {shown} has no FOR UPDATE SKIP LOCKED; the relay needs {name} >= "
            f"{'.'.join(map(str, needed))}"
        )


# -- claims -------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What happened to one claimed row: sent, or an error and when to try again."""

    id: int
    error: str | None = None
    next_attempt_at: int | None = None  # None with an error: give up (failed)


class Claim(Protocol):
    """A claimed batch. ``finish`` records the outcomes; leaving the ``with`` ends the claim."""

    rows: Sequence[Row]

    def finish(self, outcomes: Sequence[Outcome], now_ms: int) -> None: ...


def _heads_query(tables: OutboxTables, now_ms: int, batch: int, failed_blocks: bool):  # noqa: ANN202
    o = tables.outbox.alias("o")
    p = tables.outbox.alias("p")
    blocking = (PENDING, FAILED) if failed_blocks else (PENDING,)
    older = select(p.c.id).where(
        p.c.aggregate_type == o.c.aggregate_type,
        p.c.aggregate_id == o.c.aggregate_id,
        p.c.id < o.c.id,
        p.c.status.in_(blocking),
    )
    query = (
        select(o)
        .where(o.c.status == PENDING, o.c.next_attempt_at <= now_ms, ~exists(older))
        .order_by(o.c.status, o.c.id)
        .limit(batch)
    )
    return o, query


def _write_outcomes(
    conn: Connection,
    tables: OutboxTables,
    outcomes: Sequence[Outcome],
    now_ms: int,
    owner: str | None,
) -> None:
    t = tables.outbox
    sent = [o.id for o in outcomes if o.error is None]
    if sent:
        stmt = update(t).where(t.c.id.in_(sent), t.c.status == PENDING)
        if owner is not None:
            stmt = stmt.where(t.c.lease_owner == owner)
        conn.execute(
            stmt.values(
                status=SENT,
                sent_at=now_ms,
                attempts=t.c.attempts + 1,
                lease_owner=None,
                lease_until=None,
                last_error=None,
            )
        )
    for outcome in outcomes:
        if outcome.error is None:
            continue
        values: dict[str, Any] = {
            "attempts": t.c.attempts + 1,
            "last_error": outcome.error[:2000],
            "lease_owner": None,
            "lease_until": None,
        }
        if outcome.next_attempt_at is None:
            values["status"] = FAILED
        else:
            values["next_attempt_at"] = outcome.next_attempt_at
        stmt = update(t).where(t.c.id == outcome.id, t.c.status == PENDING)
        if owner is not None:
            stmt = stmt.where(t.c.lease_owner == owner)
        conn.execute(stmt.values(**values))


class _LockedClaim(Claim):
    def __init__(self, conn: Connection, tables: OutboxTables, rows: Sequence[Row]) -> None:
        self.conn = conn
        self.tables = tables
        self.rows = rows

    def finish(self, outcomes: Sequence[Outcome], now_ms: int) -> None:
        _write_outcomes(self.conn, self.tables, outcomes, now_ms, owner=None)


class _LeasedClaim(Claim):
    def __init__(
        self, engine: Engine, tables: OutboxTables, rows: Sequence[Row], owner: str
    ) -> None:
        self.engine = engine
        self.tables = tables
        self.rows = rows
        self.owner = owner

    def finish(self, outcomes: Sequence[Outcome], now_ms: int) -> None:
        with self.engine.begin() as conn:
            _write_outcomes(conn, self.tables, outcomes, now_ms, owner=self.owner)


# Plan settings for a PostgreSQL claim's transaction (SET LOCAL: they end with it).
# - custom plans: psycopg prepares a statement after a few executions, and a generic
#   plan made while the outbox was empty (an idle relay) is a scan of the whole table
#   per head once a backlog arrives: seconds per claim. Planning each claim is ~0.2 ms.
# - no sort, no bitmap scan: walk the (status, id) index in order and stop at the
#   batch. Misled by stale statistics after a burst of inserts (autovacuum has not
#   analysed the table yet), the planner otherwise collects every pending head and
#   sorts them: a cost proportional to the backlog on every claim.
# - asynchronous commit: the claim's commit only records "sent" marks; losing the last
#   few to a database crash republishes those messages, which at-least-once allows,
#   and saves a WAL flush per batch. The application's inserts keep their own setting.
_PG_CLAIM_SETTINGS = text(
    "SELECT set_config('plan_cache_mode', 'force_custom_plan', true), "
    "set_config('synchronous_commit', 'off', true),"
    " set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true)"
)


class Claimer:
    """Claims batches of head-of-aggregate rows for one engine and table prefix."""

    def __init__(
        self,
        engine: Engine,
        tables: OutboxTables,
        *,
        lease_seconds: float = 60.0,
        failed_blocks_aggregate: bool = True,
    ) -> None:
        self.engine = engine
        self.tables = tables
        self.lease_ms = int(lease_seconds * 1000)
        self.failed_blocks = failed_blocks_aggregate
        self.kind = backend(engine)
        self._claim_engine: Engine
        if self.kind == "mysql":
            self._claim_engine = engine.execution_options(isolation_level="READ COMMITTED")
        else:
            self._claim_engine = engine

    def check(self) -> None:
        with self.engine.connect() as conn:
            check_skip_locked(conn)

    @contextlib.contextmanager
    def claim(self, batch: int, now_ms: int, owner: str) -> Iterator[Claim]:
        """Claim up to ``batch`` rows; the claim ends (commit) when the block exits."""
        if self.kind == "sqlite":
            yield self._lease(batch, now_ms, owner)
            return
        with self._claim_engine.begin() as conn:
            o, query = _heads_query(self.tables, now_ms, batch, self.failed_blocks)
            if self.kind == "postgresql":
                conn.execute(_PG_CLAIM_SETTINGS)
                query = query.with_for_update(skip_locked=True, of=o)
            else:
                query = query.with_for_update(skip_locked=True)
            rows = conn.execute(query).all()
            yield _LockedClaim(conn, self.tables, rows)

    def _lease(self, batch: int, now_ms: int, owner: str) -> Claim:
        t = self.tables.outbox
        o, heads = _heads_query(self.tables, now_ms, batch, self.failed_blocks)
        # A row leased by a live worker is still pending, so it keeps blocking its aggregate.
        # The read and the stamp need no common lock: the UPDATE re-checks status and lease,
        # so of two claimers reading the same heads only one stamps each row.
        heads = heads.where((o.c.lease_until.is_(None)) | (o.c.lease_until < now_ms))
        until = now_ms + self.lease_ms
        with self.engine.begin() as conn:
            ids = [row.id for row in conn.execute(heads.with_only_columns(o.c.id)).all()]
            if not ids:
                return _LeasedClaim(self.engine, self.tables, [], owner)
            conn.execute(
                update(t)
                .where(t.c.id.in_(ids), t.c.status == PENDING)
                .where((t.c.lease_until.is_(None)) | (t.c.lease_until < now_ms))
                .values(lease_owner=owner, lease_until=until)
            )
            rows = conn.execute(
                select(t)
                .where(t.c.id.in_(ids), t.c.lease_owner == owner, t.c.lease_until == until)
                .order_by(t.c.id)
            ).all()
        return _LeasedClaim(self.engine, self.tables, rows, owner)


# -- the intermediate-queue check ---------------------------------------------------------


def insert_if_absent(conn: Connection, tables: OutboxTables, key: str, now_ms: int) -> bool:
    """Insert ``key`` unless a committed row has it; True if this call inserted it.

    The insert contends for the key's unique-index entry, so when another
    transaction has inserted the same key and is still open, this waits for
    it to end (PostgreSQL and InnoDB wait on the uncommitted duplicate;
    SQLite waits for the write lock). A plain SELECT would not wait on
    PostgreSQL: it would not see the open transaction's row and answer early.
    """
    t = tables.intermediate
    values = {"id": key, "created_at": now_ms}
    kind = backend(conn)
    if kind == "postgresql":
        # RETURNING rather than rowcount: psycopg reports -1 for ON CONFLICT through SQLAlchemy.
        returning = (
            pg_insert(t)
            .values(**values)
            .on_conflict_do_nothing(index_elements=[t.c.id])
            .returning(t.c.id)
        )
        return conn.execute(returning).first() is not None
    stmt: Insert
    if kind == "mysql":
        stmt = insert(t).values(**values).prefix_with("IGNORE")
    else:
        stmt = insert(t).values(**values).prefix_with("OR IGNORE")
    return conn.execute(stmt).rowcount == 1


# -- PostgreSQL wake-ups ------------------------------------------------------------------


def install_notify_trigger(conn: Connection, tables: OutboxTables) -> None:
    """A statement-level trigger that NOTIFYs the relay when rows are inserted (delivered at
    commit)."""
    table = tables.outbox.name
    function = f"{tables.prefix}outbox_notify"
    conn.execute(
        text(
            f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN PERFORM pg_notify('{tables.notify_channel}', ''); RETURN NULL; END $$"
        )
    )
    conn.execute(text(f"DROP TRIGGER IF EXISTS {table}_notify ON {table}"))
    conn.execute(
        text(
            f"CREATE TRIGGER {table}_notify AFTER INSERT ON {table} FOR EACH STATEMENT EXECUTE "
            f"FUNCTION {function}()"
        )
    )


def drop_notify_trigger(conn: Connection, tables: OutboxTables) -> None:
    conn.execute(text(f"DROP FUNCTION IF EXISTS {tables.prefix}outbox_notify() CASCADE"))


class NotifyListener:
    """A thread LISTENing on the outbox channel; calls ``on_notify`` per wake-up.

    Runs on its own autocommit psycopg connection. If the connection drops it
    reconnects; meanwhile the relay's polling interval still bounds latency.
    """

    def __init__(self, engine: Engine, channel: str, on_notify: Callable[[], None]) -> None:
        self.engine = engine
        self.channel = channel
        self.on_notify = on_notify
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outbox-listen", daemon=True)
        self.listening = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        import psycopg  # here: an optional driver, needed only for PostgreSQL's LISTEN

        url = self.engine.url.set(drivername="postgresql")
        dsn = url.render_as_string(hide_password=False)
        while not self._stop.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True) as pg:
                    pg.execute(f'LISTEN "{self.channel}"')
                    self.listening.set()
                    self.on_notify()  # rows may have come while not listening
                    while not self._stop.is_set():
                        ready, _, _ = _select.select([pg.fileno()], [], [], 0.5)
                        if not ready:
                            continue
                        got = list(pg.notifies(timeout=0))
                        if got:
                            self.on_notify()
            except Exception as exc:  # noqa: BLE001 — a lost listener must not stop the relay
                self.listening.clear()
                log.warning("event=outbox_listen_failed error=%r", exc)
                self._stop.wait(1.0)
