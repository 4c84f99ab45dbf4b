"""Half messages bound to the application's own database transaction.

``TransactionalSender.transaction(conn)`` wraps one database transaction.
Each ``tx.send(message)`` inside it does two things, in this order:

1. inserts a row into the transaction-log table (log id, topic, keys, time)
   on the application's connection, in its open transaction;
2. sends the message to halfmoon as a half message (stored, invisible),
   carrying the log id in the user property ``halfmoon_txlog_id``.

Leaving the block commits the database transaction and *then* commits the
half messages; an exception rolls the database back and then the messages.
The order matters twice:

- The row is inserted before the half message exists, so by the time the
  broker can check, the row's key is either committed, rolled back, or held
  by a still-open transaction. The check listener
  (:class:`~halfmoon.outbox.checker.TransactionLogChecker`) contends for that
  key, so an open transaction makes the answer wait instead of making it
  wrong.
- The message decision follows the database outcome, never precedes it. A
  crash between the database commit and EndTransaction leaves the half
  message undecided; the broker's check finds the row and commits it. A
  crash before the database commit loses the row with the transaction; the
  check finds no row and rolls the message back.

Why a context manager and not SQLAlchemy events: Core ``Connection`` has no
"after commit" event (``ConnectionEvents.commit`` fires *before* the COMMIT
is sent, so a failed COMMIT would already have published the message);
``after_commit`` exists only on the ORM ``Session``. Driving the commit
ourselves is the only reliable order on a Core connection.

Log rows are cleaned up by :func:`halfmoon.outbox.checker.cleanup_transaction_log`
once they are older than every check the broker may still send.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Index,
    MetaData,
    String,
    Table,
    insert,
)

from halfmoon.client.message import Message, SendReceipt
from halfmoon.client.sync import SyncTransactionProducer, run_sync
from halfmoon.client.transaction import Transaction, TransactionProducer
from halfmoon.errors import HalfmoonError

log = logging.getLogger("halfmoon.outbox.txlog")

# The user property that carries the log row's id to the check listener.
TXLOG_ID_PROPERTY = "halfmoon_txlog_id"
MAX_KEYS_LENGTH = 1024


class TransactionLogError(HalfmoonError):
    """The transactional sender was used in a way that cannot keep its promise."""

    code = "TXLOG_MISUSE"
    protocol_code = "BAD_REQUEST"
    http_status = 400


def now_ms() -> int:
    return int(time.time() * 1000)


def _check_prefix(prefix: str) -> str:
    if not prefix.replace("_", "").isalnum():
        raise ValueError(f"table prefix {prefix!r} must be letters, digits and underscores")
    return prefix


class TransactionLog:
    """The transaction-log table of one ``table_prefix`` (``<prefix>txlog``).

    One row per half message: ``id`` (the log id the message carries),
    ``producer_group``, ``topic``, ``message_keys`` (space separated) and
    ``created_at`` (epoch ms, indexed for the cleanup).
    """

    def __init__(self, *, table_prefix: str = "hm_", metadata: MetaData | None = None) -> None:
        self.prefix = _check_prefix(table_prefix)
        self.metadata = metadata if metadata is not None else MetaData()
        self.table = Table(
            f"{self.prefix}txlog",
            self.metadata,
            Column("id", String(64), primary_key=True),
            Column("producer_group", String(255), nullable=False, default=""),
            Column("topic", String(255), nullable=False),
            Column("message_keys", String(MAX_KEYS_LENGTH), nullable=False, default=""),
            Column("created_at", BigInteger, nullable=False),
        )
        Index(f"{self.prefix}txlog_age", self.table.c.created_at)

    def create(self, bind: Engine | Connection) -> None:
        """Create the table and its index if missing."""
        self.metadata.create_all(bind, tables=[self.table])

    def drop(self, bind: Engine | Connection) -> None:
        self.metadata.drop_all(bind, tables=[self.table])

    def record(
        self, conn: Connection, log_id: str, topic: str, keys: list[str], producer_group: str = ""
    ) -> None:
        """Insert the row for one half message on ``conn`` (in its transaction)."""
        conn.execute(
            insert(self.table).values(
                id=log_id,
                producer_group=producer_group,
                topic=topic,
                message_keys=" ".join(keys)[:MAX_KEYS_LENGTH],
                created_at=now_ms(),
            )
        )


@dataclass
class BoundTransaction:
    """The half messages of one database transaction (what ``transaction()`` yields)."""

    conn: Connection
    _sender: TransactionalSender
    _txn: Transaction
    receipts: list[SendReceipt] = field(default_factory=list)
    log_ids: list[str] = field(default_factory=list)
    # How the messages were decided: "committed", "rolled_back", or "left_to_check"
    # (the decision could not be sent; the broker's check will settle it from the log).
    outcome: str = "open"

    def _prepare(self, message: Message) -> str:
        if self.outcome != "open":
            raise TransactionLogError("this transaction has ended; send inside the `with` block")
        log_id = uuid.uuid4().hex
        message.properties[TXLOG_ID_PROPERTY] = log_id
        # The row first: its key lock is what makes an early check wait (module docstring).
        self._sender.log.record(
            self.conn, log_id, message.topic, message.keys, self._sender.producer_group
        )
        self.log_ids.append(log_id)
        return log_id

    def send(self, message: Message) -> SendReceipt:
        """Write the log row and send ``message`` as a half message (synchronous sender)."""
        self._prepare(message)
        receipt = run_sync(self._txn.send(message), self._sender.timeout)
        self.receipts.append(receipt)
        return receipt

    async def send_async(self, message: Message) -> SendReceipt:
        """As :meth:`send`, for the asyncio sender (the database call runs inline)."""
        self._prepare(message)
        receipt = await self._txn.send(message)
        self.receipts.append(receipt)
        return receipt


class TransactionalSender:
    """Sends half messages inside database transactions; the database outcome decides them.

    ``producer`` is a :class:`~halfmoon.client.SyncTransactionProducer` (use
    :meth:`transaction`) or an asyncio
    :class:`~halfmoon.client.TransactionProducer` (use :meth:`atransaction`).
    Give the producer a :class:`~halfmoon.outbox.checker.TransactionLogChecker`
    as its listener and the topics it sends to (``topics=[...]``: the broker
    routes checks to producers that declared the topic).
    """

    def __init__(
        self,
        producer: SyncTransactionProducer | TransactionProducer,
        log: TransactionLog,
        *,
        timeout: float = 30.0,
    ) -> None:
        self.producer = producer
        self.log = log
        self.timeout = timeout
        client = producer.client if isinstance(producer, SyncTransactionProducer) else producer
        self._client: TransactionProducer = client
        self.producer_group = client.producer_group

    @contextlib.contextmanager
    def transaction(self, bind: Connection | Engine) -> Iterator[BoundTransaction]:
        """One database transaction with half messages: commit both, or roll back both.

        ``bind`` is an Engine (a connection is opened and closed here) or a
        Connection not inside a ``with conn.begin():`` block of its own (its
        current transaction, begun or autobegun, is committed here).
        """
        if not isinstance(self.producer, SyncTransactionProducer):
            raise TransactionLogError(
                "transaction() needs a SyncTransactionProducer; with an asyncio "
                "TransactionProducer use `async with sender.atransaction(conn)`"
            )
        with _connection(bind) as conn:
            tx = BoundTransaction(conn, self, self._client.begin())
            try:
                yield tx
            except BaseException:
                _rollback_db(conn)
                self._settle(tx, commit=False)
                raise
            self._commit_db(tx)
            self._settle(tx, commit=True)

    @contextlib.asynccontextmanager
    async def atransaction(self, bind: Connection | Engine) -> AsyncIterator[BoundTransaction]:
        """As :meth:`transaction` for an asyncio producer; use ``await tx.send_async(message)``."""
        if isinstance(self.producer, SyncTransactionProducer):
            raise TransactionLogError(
                "atransaction() needs an asyncio TransactionProducer; with a "
                "SyncTransactionProducer use `with sender.transaction(conn)`"
            )
        with _connection(bind) as conn:
            tx = BoundTransaction(conn, self, self._client.begin())
            try:
                yield tx
            except BaseException:
                _rollback_db(conn)
                await self._settle_async(tx, commit=False)
                raise
            self._commit_db(tx)
            await self._settle_async(tx, commit=True)

    def _commit_db(self, tx: BoundTransaction) -> None:
        try:
            tx.conn.commit()
        except BaseException:
            # A failed COMMIT may still have committed (connection lost after the
            # server applied it). Only the check can tell: leave the messages to it.
            tx.outcome = "left_to_check"
            log.warning(
                "event=txlog_commit_failed log_ids=%s decision=left_to_check", ",".join(tx.log_ids)
            )
            raise

    def _settle(self, tx: BoundTransaction, *, commit: bool) -> None:
        if not tx.receipts:
            tx.outcome = "committed" if commit else "rolled_back"
            return
        try:
            run_sync(tx._txn.commit() if commit else tx._txn.rollback(), self.timeout)
            tx.outcome = "committed" if commit else "rolled_back"
        except Exception as exc:  # noqa: BLE001 - the database already decided; the check settles the message
            tx.outcome = "left_to_check"
            log.warning(
                "event=txlog_end_failed commit=%s log_ids=%s error=%r",
                commit,
                ",".join(tx.log_ids),
                exc,
            )

    async def _settle_async(self, tx: BoundTransaction, *, commit: bool) -> None:
        if not tx.receipts:
            tx.outcome = "committed" if commit else "rolled_back"
            return
        try:
            await (tx._txn.commit() if commit else tx._txn.rollback())
            tx.outcome = "committed" if commit else "rolled_back"
        except Exception as exc:  # noqa: BLE001 - see _settle
            tx.outcome = "left_to_check"
            log.warning(
                "event=txlog_end_failed commit=%s log_ids=%s error=%r",
                commit,
                ",".join(tx.log_ids),
                exc,
            )


@contextlib.contextmanager
def _connection(bind: Connection | Engine) -> Iterator[Connection]:
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            yield conn
        return
    if bind.in_nested_transaction():
        raise TransactionLogError(
            "transaction() cannot run inside a SAVEPOINT: it must own the outer COMMIT"
        )
    yield bind


def _rollback_db(conn: Connection) -> None:
    try:
        conn.rollback()
    except Exception as exc:  # noqa: BLE001 - the connection is gone: its transaction is rolled back anyway
        log.warning("event=txlog_rollback_failed error=%r", exc)
