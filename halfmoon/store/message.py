"""The message as the store sees it: what goes in, and what comes back out.

The store knows bytes and offsets, not what topics mean. A message carries a
string map of properties; a few well-known keys (tags, keys, the unique id)
are read by the store's dispatcher to fill the consume queue's tag hash and
the key index. Everything else is opaque to the store.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field

# Property keys the store itself reads. The names follow RocketMQ's
# MessageConst so a message's properties look familiar to its users.
PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"  # several keys are separated by KEY_SEPARATOR
PROPERTY_UNIQUE_ID = "UNIQ_KEY"  # the message id the client sees
KEY_SEPARATOR = " "


class SysFlag(enum.IntFlag):
    """Bits of a record's system flags (a u32 in the record)."""

    NONE = 0
    # Transaction state: two bits, as RocketMQ's MessageSysFlag.
    TRANSACTION_PREPARED = 0x04
    TRANSACTION_COMMITTED = 0x08
    TRANSACTION_ROLLED_BACK = 0x0C
    # Body is compressed by the producer; the store never looks inside.
    COMPRESSED = 0x01

    TRANSACTION_MASK = 0x0C


@dataclass(slots=True)
class Message:
    """A message to append. The store assigns the offsets and store timestamp."""

    topic: str
    body: bytes
    queue_id: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    flags: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0  # milliseconds since the epoch
    born_host: str = ""
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROPERTY_KEYS)
        if not raw:
            return []
        keys = raw.split(KEY_SEPARATOR)
        # Every read decodes the keys: filter only when there is an empty one to drop.
        return [k for k in keys if k] if "" in keys else keys


@dataclass(slots=True)
class StoredMessage:
    """A message read back from the commit log, with everything the store assigned."""

    topic: str
    body: bytes
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    size: int  # bytes of the whole record in the commit log
    properties: dict[str, str]
    flags: int
    sys_flag: int
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int
    prepared_transaction_offset: int

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROPERTY_KEYS)
        if not raw:
            return []
        keys = raw.split(KEY_SEPARATOR)
        # Every read decodes the keys: filter only when there is an empty one to drop.
        return [k for k in keys if k] if "" in keys else keys

    @property
    def unique_id(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQUE_ID)


def tag_hash(tag: str | None) -> int:
    """The 8-byte tag hash stored in consume-queue entries (0 when there is no tag).

    A stable 64-bit hash: the first 8 bytes of BLAKE2b over the tag's UTF-8
    bytes, read as a signed big-endian integer so it fits the signed field.
    It must never change: consume queues on disk hold it.
    """
    if not tag:
        return 0
    digest = hashlib.blake2b(tag.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    value = int.from_bytes(digest, "big", signed=True)
    return value or 1  # 0 is reserved for "no tag"
