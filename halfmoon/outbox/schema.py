"""The outbox tables, as SQLAlchemy Core ``Table`` objects on one ``MetaData`` per prefix.

Times are epoch milliseconds in ``BIGINT`` columns: the same type and the
same arithmetic on SQLite, PostgreSQL and MariaDB, with no time-zone rules
to disagree about. ``headers`` is JSON text (portable), ``payload`` binary.

Indexes serve the relay's two hot queries:

- the claim: "pending rows, oldest first, whose aggregate has no older
  pending or failed row" — ``(status, id)`` for the scan and
  ``(aggregate_type, aggregate_id, id)`` for the per-aggregate look-back;
- the cleanup: "sent rows older than the retention" — ``(status, sent_at)``.

Tables created before an index changed keep their old index (``create_all``
skips existing tables); the relay works with either.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)
from sqlalchemy.dialects import mysql

PENDING = "pending"
SENT = "sent"
FAILED = "failed"
STATUSES = (PENDING, SENT, FAILED)

# SQLite only auto-increments an INTEGER PRIMARY KEY (its rowid alias).
_ID = BigInteger().with_variant(Integer(), "sqlite")
# MariaDB's BLOB stops at 64 KiB; messages may be larger.
_PAYLOAD = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
_TEXT = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")


@dataclass(frozen=True)
class OutboxTables:
    """The tables of one ``table_prefix``."""

    metadata: MetaData
    outbox: Table
    intermediate: Table
    prefix: str

    @property
    def notify_channel(self) -> str:
        """The PostgreSQL LISTEN/NOTIFY channel the insert trigger signals."""
        return f"{self.prefix}outbox_new"


def outbox_tables(prefix: str = "hm_") -> OutboxTables:
    """Build the outbox tables for ``prefix`` (a fresh ``MetaData`` each call)."""
    if not prefix.replace("_", "").isalnum():
        raise ValueError(f"table prefix {prefix!r} must be letters, digits and underscores")
    metadata = MetaData()
    outbox = Table(
        f"{prefix}outbox",
        metadata,
        Column("id", _ID, primary_key=True, autoincrement=True),
        # A unique id per message: the consumer's idempotency key (sent as a header/key).
        Column("message_id", String(64), nullable=False, unique=True),
        Column("aggregate_type", String(100), nullable=False, default=""),
        Column("aggregate_id", String(200), nullable=False, default=""),
        # halfmoon topic, or RabbitMQ exchange ("" is the default exchange).
        Column("topic", String(255), nullable=False),
        # RabbitMQ routing key; halfmoon ignores it (it uses keys / message_group).
        Column("routing_key", String(255), nullable=False, default=""),
        Column("keys", Text, nullable=True),  # JSON list of message keys
        Column("tag", String(128), nullable=True),
        Column("message_group", String(200), nullable=True),  # halfmoon FIFO group
        Column("headers", _TEXT, nullable=True),  # JSON object of string -> string
        Column("payload", _PAYLOAD, nullable=False),
        Column("status", String(16), nullable=False, default=PENDING),
        Column("attempts", Integer, nullable=False, default=0),
        Column("next_attempt_at", BigInteger, nullable=False),
        Column("created_at", BigInteger, nullable=False),
        Column("sent_at", BigInteger, nullable=True),
        Column("last_error", _TEXT, nullable=True),
        # SQLite has no row locks: a claim is a lease (owner + expiry) instead.
        Column("lease_owner", String(64), nullable=True),
        Column("lease_until", BigInteger, nullable=True),
    )
    # On PostgreSQL the claim and look-back indexes are partial: a row marked sent
    # leaves them (its new version gets two index entries fewer, which is most of
    # the cost of marking a batch) and the look-back never walks an aggregate's
    # sent history. The relay plans claims per execution (custom plans), so the
    # predicates are provable. SQLite cannot prove them for bound parameters and
    # MariaDB has no partial indexes: both keep the full ones.
    Index(
        f"{prefix}outbox_claim",
        outbox.c.status,
        outbox.c.id,
        postgresql_where=outbox.c.status == PENDING,
    )
    Index(
        f"{prefix}outbox_aggregate", outbox.c.aggregate_type, outbox.c.aggregate_id, outbox.c.id,
        postgresql_where=outbox.c.status.in_([PENDING, FAILED]),
    )  # fmt: skip
    Index(f"{prefix}outbox_cleanup", outbox.c.status, outbox.c.sent_at)
    intermediate = Table(
        f"{prefix}outbox_intermediate",
        metadata,
        # The unique id carried by a message parked in RabbitMQ's intermediate queue.
        Column("id", String(64), primary_key=True),
        Column("created_at", BigInteger, nullable=False),
    )
    Index(f"{prefix}outbox_intermediate_age", intermediate.c.created_at)
    return OutboxTables(metadata, outbox, intermediate, prefix)
