"""The built-in check listener: answer the broker's checks from the transaction log.

When a half message stays undecided (the producer crashed between its
database commit and EndTransaction, or EndTransaction was lost), the broker
asks a live producer of the group. :class:`TransactionLogChecker` answers
from the table :class:`~halfmoon.outbox.txlog.TransactionLog` wrote:

- the row exists (committed)                       → COMMIT
- the row is absent and its transaction is over   → ROLLBACK
- cannot tell yet (its transaction is still open
  past the wait, or the database is unreachable)  → UNKNOWN (checked again)

"Over" is the hard part. A plain SELECT does not see another transaction's
uncommitted row, so on PostgreSQL it would answer ROLLBACK for a transaction
about to commit. Instead the check *inserts the same key* in its own
transaction (``INSERT ... ON CONFLICT DO NOTHING`` / ``INSERT IGNORE`` /
``INSERT OR IGNORE``) under a lock timeout:

- an open inserting transaction holds the key (PostgreSQL and InnoDB make a
  duplicate insert wait on the uncommitted row; SQLite's writer holds the
  database write lock), so the probe *waits* for it to end;
- once it committed, the probe inserts nothing → COMMIT;
- once it rolled back (or never was), the probe inserts a row → ROLLBACK,
  and the probe's own transaction is rolled back, leaving no trace.

The sender inserts the row before the half message exists, so when a check
arrives the row is already inserted, committed or rolled back: never "not
yet inserted". A wait longer than ``lock_timeout`` answers UNKNOWN, and the
broker asks again at its next check interval.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, select
from sqlalchemy.exc import DBAPIError

from halfmoon.client.message import Message, MessageView
from halfmoon.client.transaction import TransactionResolution
from halfmoon.outbox.inbox import backend, insert_if_absent
from halfmoon.outbox.txlog import TXLOG_ID_PROPERTY, TransactionLog, now_ms

log = logging.getLogger("halfmoon.outbox.checker")


class TransactionLogChecker:
    """A :class:`~halfmoon.client.TransactionListener` answering checks from the log table.

    ``engine`` reaches the application's database (its own connections,
    never the application's). ``lock_timeout`` bounds how long one check waits
    for a still-open transaction before answering UNKNOWN. ``fallback``
    answers checks for messages that carry no log id (sent some other way).
    """

    def __init__(
        self,
        engine: Engine,
        log: TransactionLog,
        *,
        lock_timeout: float = 5.0,
        fallback: Any = None,
    ) -> None:
        self.engine = engine
        self.log = log
        self.lock_timeout = lock_timeout
        self.fallback = fallback
        self.answers: dict[TransactionResolution, int] = dict.fromkeys(TransactionResolution, 0)

    def execute_local_transaction(self, message: Message, arg: Any) -> TransactionResolution:
        # The sender decides messages itself after the database outcome; this path
        # only runs if someone uses send_message_in_transaction with this listener.
        return TransactionResolution.UNKNOWN

    def check_local_transaction(self, message: MessageView) -> TransactionResolution:
        """The broker asks about an undecided half message: answer from the table."""
        log_id = message.properties.get(TXLOG_ID_PROPERTY)
        if not log_id:
            if self.fallback is not None:
                return self.fallback.check_local_transaction(message)
            log.warning(
                "event=check_without_log_id message_id=%s answer=UNKNOWN", message.message_id
            )
            return TransactionResolution.UNKNOWN
        answer = self.resolve(log_id)
        self.answers[answer] += 1
        log.info(
            "event=txlog_check log_id=%s message_id=%s answer=%s",
            log_id,
            message.message_id,
            answer.value,
        )
        return answer

    def resolve(self, log_id: str) -> TransactionResolution:
        """COMMIT, ROLLBACK or UNKNOWN for the transaction that wrote (or not) ``log_id``."""
        try:
            with self.engine.connect() as conn, _lock_timeout(conn, self.lock_timeout):
                try:
                    inserted = insert_if_absent(
                        conn,
                        self.log.table,
                        {
                            "id": log_id,
                            "topic": "",
                            "message_keys": "",
                            "producer_group": "",
                            "created_at": now_ms(),
                        },
                    )
                finally:
                    # The probe row must never stay: it only proved the key was free.
                    conn.rollback()
        except DBAPIError as exc:
            # Lock timeout (the transaction is still open), deadlock victim, lost
            # connection: none of these says how the transaction ended.
            log.info(
                "event=txlog_check_undecided log_id=%s error=%s",
                log_id,
                type(exc.orig).__name__ if exc.orig else exc,
            )
            return TransactionResolution.UNKNOWN
        return TransactionResolution.ROLLBACK if inserted else TransactionResolution.COMMIT


class _lock_timeout:
    """Bound how long statements on ``conn`` wait for locks, per backend.

    PostgreSQL: ``SET LOCAL lock_timeout`` (ends with the transaction).
    MariaDB/MySQL: ``innodb_lock_wait_timeout`` (whole seconds, at least 1)
    for the session, restored afterwards. SQLite: the busy timeout, restored.
    """

    def __init__(self, conn: Connection, seconds: float) -> None:
        self.conn = conn
        self.seconds = seconds
        self.kind = backend(conn)
        self.previous: Any = None

    def __enter__(self) -> None:
        if self.kind == "postgresql":
            self.conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(self.seconds * 1000)}ms'")
        elif self.kind == "mysql":
            self.previous = self.conn.exec_driver_sql(
                "SELECT @@SESSION.innodb_lock_wait_timeout"
            ).scalar()
            self.conn.exec_driver_sql(
                f"SET SESSION innodb_lock_wait_timeout = {max(1, round(self.seconds))}"
            )
        elif self.kind == "sqlite":
            self.previous = self.conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
            self.conn.exec_driver_sql(f"PRAGMA busy_timeout = {int(self.seconds * 1000)}")

    def __exit__(self, *exc: object) -> None:
        if self.previous is None:
            return
        try:
            if self.kind == "mysql":
                self.conn.exec_driver_sql(
                    f"SET SESSION innodb_lock_wait_timeout = {int(self.previous)}"
                )
            elif self.kind == "sqlite":
                self.conn.exec_driver_sql(f"PRAGMA busy_timeout = {int(self.previous)}")
            self.conn.commit()
        except DBAPIError as exc:  # the connection is invalidated anyway
            log.debug("event=lock_timeout_restore_failed error=%r", exc)


def cleanup_transaction_log(
    engine: Engine,
    log: TransactionLog,
    *,
    older_than: timedelta = timedelta(days=1),
    batch_size: int = 1000,
    max_batches: int | None = None,
) -> int:
    """Delete log rows older than ``older_than`` in batches of ``batch_size``; the count.

    Each batch is its own short transaction, so the cleanup never holds many
    locks at once. ``older_than`` must exceed the broker's whole check window
    (``transaction.timeout_ms`` + ``check_max`` x ``check_interval_ms``, and any
    producer check immunity): a check for a message whose row was deleted
    would be answered ROLLBACK.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    cutoff = now_ms() - int(older_than.total_seconds() * 1000)
    table = log.table
    deleted = 0
    batches = 0
    while max_batches is None or batches < max_batches:
        with engine.begin() as conn:
            ids = (
                conn.execute(
                    select(table.c.id)
                    .where(table.c.created_at < cutoff)
                    .order_by(table.c.created_at)
                    .limit(batch_size)
                )
                .scalars()
                .all()
            )
            if not ids:
                break
            deleted += conn.execute(delete(table).where(table.c.id.in_(ids))).rowcount
        batches += 1
        if len(ids) < batch_size:
            break
    return deleted
