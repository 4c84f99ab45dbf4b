"""The database consistency toolkit: transactional outbox and relay, intermediate queue, ...

Built on SQLAlchemy 2 Core; SQLite by default, PostgreSQL and MariaDB in
production. See ``docs/toolkit.md``.
"""

from halfmoon.outbox.intermediate import IntermediateMover, IntermediatePublisher
from halfmoon.outbox.outbox import (
    InvalidOutboxMessage,
    Outbox,
    OutboxError,
    OutboxMessage,
    OutboxRecord,
    OutboxStatus,
    UnsupportedDatabase,
)
from halfmoon.outbox.relay import Relay, RelayStats
from halfmoon.outbox.schema import OutboxTables, outbox_tables
from halfmoon.outbox.targets import (
    HalfmoonTarget,
    InvalidTarget,
    PublishTarget,
    RabbitTarget,
    UnroutableMessage,
    target_for_url,
)

__all__ = [
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
    "RelayStats",
    "UnroutableMessage",
    "UnsupportedDatabase",
    "outbox_tables",
    "target_for_url",
]
