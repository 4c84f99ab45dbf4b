"""The message as the store sees it: what goes in, and what comes back out.

The store knows bytes and offsets, not what topics mean. A message carries a
string map of properties; a few well-known keys (tags, keys, the unique id)
are read by the store's dispatcher to fill the consume queue's tag hash and
the key index. Everything else is opaque to the store.
"""

from __future__ import annotations

import dataclasses
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
    # The record names more than one destination (a destination list follows its
    # properties, ``record.py``): one record indexed into several queues. Set and read by
    # the store only; the messages it hands out never carry it.
    DESTINATIONS = 0x100

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
    # The record's other destinations (topic, queue id, queue offset) besides the one named
    # by ``topic``, ``queue_id`` and ``queue_offset``: empty for a record of one queue.
    destinations: tuple[tuple[str, int, int], ...] = ()

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

    def placements(self) -> list[tuple[str, int, int]]:
        """Every (topic, queue id, queue offset) the record is indexed at, its own first."""
        return [(self.topic, self.queue_id, self.queue_offset), *self.destinations]

    def at(self, topic: str, queue_id: int, queue_offset: int) -> StoredMessage | None:
        """The message as the queue (topic, queue_id) holds it at ``queue_offset``: this one,
        or a copy naming that destination; None when the record is not indexed there."""
        if self.topic == topic and self.queue_id == queue_id and self.queue_offset == queue_offset:
            return self
        for placement in self.destinations:
            if placement == (topic, queue_id, queue_offset):
                return dataclasses.replace(
                    self, topic=topic, queue_id=queue_id, queue_offset=queue_offset
                )
        return None

    def in_topic(self, topic: str) -> StoredMessage | None:
        """The message as ``topic`` holds it (its first queue there), or None."""
        if self.topic == topic:
            return self
        for t, queue_id, queue_offset in self.destinations:
            if t == topic:
                return dataclasses.replace(
                    self, topic=t, queue_id=queue_id, queue_offset=queue_offset
                )
        return None

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
