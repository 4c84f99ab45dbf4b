"""The database consistency toolkit: transaction log, outbox relay, inbox, compensations.

Built on SQLAlchemy 2 Core; SQLite by default, PostgreSQL and MariaDB in
production. See ``docs/toolkit.md``.
"""

# ruff: noqa: E402 (the extra is checked before the imports that need it)
from halfmoon.extras import require

require("db")  # before the first sqlalchemy import: a missing extra is one clear line

from halfmoon.outbox.checker import TransactionLogChecker, cleanup_transaction_log
from halfmoon.outbox.compensation import (
    Compensation,
    InvalidCompensation,
    RabbitRetryQueue,
    apply_if_version,
    compensation_listener,
    create_compensation_group,
)
from halfmoon.outbox.errors import InvalidOutboxMessage, OutboxError, UnsupportedDatabase
from halfmoon.outbox.inbox import DUPLICATE, Inbox
from halfmoon.outbox.intermediate import IntermediateMover, IntermediatePublisher
from halfmoon.outbox.outbox import Outbox, OutboxMessage, OutboxRecord, OutboxStatus
from halfmoon.outbox.relay import Relay, RelayStats
from halfmoon.outbox.relay_processes import RelayProcesses
from halfmoon.outbox.saga import Saga, SagaCompensationFailed, SagaResult
from halfmoon.outbox.schema import OutboxTables, outbox_tables
from halfmoon.outbox.targets import (
    HalfmoonTarget,
    InvalidTarget,
    PublishTarget,
    RabbitTarget,
    UnroutableMessage,
    target_for_url,
)
from halfmoon.outbox.txlog import TransactionalSender, TransactionLog, TransactionLogError

__all__ = [
    "DUPLICATE",
    "Compensation",
    "Inbox",
    "InvalidCompensation",
    "RabbitRetryQueue",
    "Saga",
    "SagaCompensationFailed",
    "SagaResult",
    "TransactionLog",
    "TransactionLogChecker",
    "TransactionLogError",
    "TransactionalSender",
    "apply_if_version",
    "cleanup_transaction_log",
    "compensation_listener",
    "create_compensation_group",
    "HalfmoonTarget",
    "IntermediateMover",
    "IntermediatePublisher",
    "InvalidOutboxMessage",
    "InvalidTarget",
    "Outbox",
    "OutboxError",
    "OutboxMessage",
    "OutboxRecord",
    "OutboxStatus",
    "OutboxTables",
    "PublishTarget",
    "RabbitTarget",
    "Relay",
    "RelayProcesses",
    "RelayStats",
    "UnroutableMessage",
    "UnsupportedDatabase",
    "outbox_tables",
    "target_for_url",
]
