"""halfmoon.store: the commit log, consume queues, key index, recovery and retention.

Open a store with ``MessageStore(StoreConfig(data_dir=...))``; the broker
uses it through the :class:`Store` protocol only.
"""

from halfmoon.store.api import (
    AppendResult,
    GetResult,
    GetStatus,
    MessagePredicate,
    Store,
    StoreStats,
    TagHashes,
)
from halfmoon.store.config import StoreConfig
from halfmoon.store.message import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQUE_ID,
    Message,
    StoredMessage,
    SysFlag,
    tag_hash,
)
from halfmoon.store.reader import MessageNotFound
from halfmoon.store.recovery import RecoveryReport, Reporter
from halfmoon.store.store import MessageStore
from halfmoon.store.validate import (
    IllegalMessageField,
    IllegalPropertyKey,
    IllegalPropertyValue,
    IllegalQueueId,
    IllegalTopic,
    MessageBodyTooLarge,
    MessagePropertiesTooLarge,
)
from halfmoon.store.writer import StoreClosed

__all__ = [
    "KEY_SEPARATOR",
    "PROPERTY_KEYS",
    "PROPERTY_TAGS",
    "PROPERTY_UNIQUE_ID",
    "AppendResult",
    "GetResult",
    "GetStatus",
    "IllegalMessageField",
    "IllegalPropertyKey",
    "IllegalPropertyValue",
    "IllegalQueueId",
    "IllegalTopic",
    "Message",
    "MessageBodyTooLarge",
    "MessageNotFound",
    "MessagePredicate",
    "MessagePropertiesTooLarge",
    "MessageStore",
    "RecoveryReport",
    "Reporter",
    "Store",
    "StoreClosed",
    "StoreConfig",
    "StoreStats",
    "StoredMessage",
    "SysFlag",
    "TagHashes",
    "tag_hash",
]
