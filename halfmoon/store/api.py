"""What the broker may ask of a store: the contract both stores implement.

``MessageStore`` (real files, ``store.py``) and ``MemoryStore`` (the in-memory
twin for fast broker tests, ``memory.py``) both satisfy :class:`Store`. The
broker is written against this protocol only.

Offsets: a *commit-log offset* is a byte position in the commit log; a
*queue offset* is the index of an entry in one (topic, queue id) consume
queue, dense from the queue's minimum to its maximum (exclusive).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from halfmoon.store.message import Message, StoredMessage


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an appended message landed."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    size: int
    store_timestamp: int

    @property
    def end_offset(self) -> int:
        """Commit-log offset just past the record: durable once flushed beyond it."""
        return self.commit_log_offset + self.size


class _AppendResultBuilder:
    """The slots of AppendResult without the frozen ``__setattr__``: see
    :func:`new_append_result`."""

    __slots__ = AppendResult.__slots__
    # Declared for the type checker only: annotations without values add no class attributes.
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    size: int
    store_timestamp: int


def new_append_result(
    topic: str, queue_id: int, queue_offset: int, commit_log_offset: int, size: int, timestamp: int
) -> AppendResult:
    """``AppendResult(...)`` at a third of the cost; the store builds one per appended message.

    A frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``. Here the fields are plain slot stores on an
    object of identical layout, which then becomes an AppendResult: the same
    object in every way (type, equality, hash, immutability).
    """
    result = _AppendResultBuilder()
    result.topic = topic
    result.queue_id = queue_id
    result.queue_offset = queue_offset
    result.commit_log_offset = commit_log_offset
    result.size = size
    result.store_timestamp = timestamp
    result.__class__ = AppendResult  # type: ignore[assignment]
    return result  # type: ignore[return-value]


class GetStatus(enum.Enum):
    FOUND = "found"
    NO_MATCHED_MESSAGE = "no_matched_message"  # entries read, none passed the tag filter
    NO_MESSAGE = "no_message"  # the queue has nothing at or after the offset (yet)
    OFFSET_TOO_SMALL = "offset_too_small"  # below the retained minimum ("offset moved")
    OFFSET_OVERFLOW = "offset_overflow"  # beyond max_offset (more than one past the end)
    NO_SUCH_QUEUE = "no_such_queue"


@dataclass(slots=True)
class GetResult:
    status: GetStatus
    messages: list[StoredMessage]
    next_offset: int  # where the caller should read next
    min_offset: int
    max_offset: int


# The tag filter a read may apply: None = every message; otherwise the set of
# accepted tag hashes (see ``message.tag_hash``), checked on consume-queue
# entries before the commit log is touched.
TagHashes = frozenset[int] | None

# A message filter applied after decoding (e.g. SQL92 over properties).
MessagePredicate = Callable[[StoredMessage], bool]


@dataclass(slots=True)
class StoreStats:
    commit_log_min_offset: int
    commit_log_max_offset: int  # written
    commit_log_flushed_offset: int
    disk_bytes: int
    segments: int
    queues: int
    extra: dict[str, int] = field(default_factory=dict)


# A message to append with its properties already encoded (``append_encoded``): topic, queue
# id, born timestamp, born host, body, encoded properties, tag (None: none) and the keys to
# index it under (its KEYS and unique id). A tuple: one is built per message.
EncodedRecord = tuple[str, int, int, str, bytes, bytes, str | None, Sequence[str]]


@runtime_checkable
class Store(Protocol):
    # -- lifecycle -----------------------------------------------------------
    def close(self) -> None:
        """Flush everything, write the checkpoint, mark a clean shutdown."""

    # -- writes --------------------------------------------------------------
    def append(self, messages: Sequence[Message]) -> list[AppendResult]:
        """Append messages in order and dispatch them to consume queues and index.

        Validates every message first: a bad one raises ``InvalidArgument``
        (a subclass with a stable code) and nothing of the batch is written.
        Returns once the records are written (not necessarily flushed); pair
        with :meth:`durable` or :meth:`wait_durable` for the flush policy.
        Thread-safe.
        """

    def append_fanout(
        self, message: Message, others: Sequence[tuple[str, int]]
    ) -> list[AppendResult]:
        """Append ``message`` once, indexed into its own queue and each of ``others``
        (topic, queue id), each with its own queue offset: one commit-log record, one
        consume-queue entry per destination. Reads of any of those queues (``get``), and
        ``query_by_key`` in any of their topics, see it as a message of that queue; ``read_at``
        sees it as its first destination's. One result per destination, its own first, all
        with the record's offset and size. Validated as :meth:`append`, destinations too."""

    def durable(self, end_offset: int) -> Future[None]:
        """A future that completes when the commit log is durable up to ``end_offset``.

        Under the ``sync`` policy that is after an fsync covering it (group
        commit: one fsync serves every waiter it covers); under ``async`` it
        completes at once. asyncio callers wrap it with ``asyncio.wrap_future``.
        """

    def wait_durable(self, end_offset: int, timeout: float | None = None) -> bool:
        """Block until :meth:`durable` would complete; False on timeout."""

    def put(self, messages: Sequence[Message]) -> list[AppendResult]:
        """``append`` then wait as the flush policy says: the simple blocking call."""

    # -- reads ---------------------------------------------------------------
    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        max_bytes: int = 4 * 1024 * 1024,
        tag_hashes: TagHashes = None,
        predicate: MessagePredicate | None = None,
    ) -> GetResult:
        """Read up to ``max_messages`` from a queue starting at queue ``offset``.

        Only messages that are visible (durable under ``sync``) are returned.
        Filtered-out entries are skipped; ``next_offset`` moves past them.
        A scan stops after examining a bounded number of entries (so a filter
        that matches nothing cannot make one call read the whole queue).
        """

    def read_at(self, commit_log_offset: int) -> StoredMessage:
        """The message whose record starts at ``commit_log_offset``.

        Raises ``NotFound`` (code ``MESSAGE_NOT_FOUND``) when nothing valid is
        there, including below the retained minimum.
        """

    def query_by_key(
        self,
        topic: str,
        key: str,
        begin_timestamp: int = 0,
        end_timestamp: int = 2**63 - 1,
        max_results: int = 64,
    ) -> list[StoredMessage]:
        """Messages of ``topic`` whose keys or unique id equal ``key``, stored in [begin, end]
        ms."""

    # -- queues --------------------------------------------------------------
    def min_offset(self, topic: str, queue_id: int) -> int:
        """First retained queue offset (0 for an unknown queue)."""

    def max_offset(self, topic: str, queue_id: int) -> int:
        """One past the last visible queue offset (0 for an unknown queue)."""

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp: int) -> int:
        """The first queue offset whose store timestamp is >= ``timestamp`` (max_offset if none)."""

    def queues(self) -> Iterable[tuple[str, int]]:
        """Every (topic, queue id) that has a consume queue."""

    def delete_topic(self, topic: str) -> None:
        """Drop the consume queues of ``topic`` (its records age out of the commit log)."""

    def add_listener(self, listener: Callable[[AppendResult], None]) -> None:
        """Call ``listener`` for each message once it becomes visible to ``get``.

        Called from the writing or flushing thread; listeners must be quick and
        must not raise (a raising listener is logged and kept). The broker uses
        it to wake long-polling consumers.
        """

    def append_encoded(self, records: Sequence[EncodedRecord]) -> list[AppendResult]:
        """:meth:`append` for messages whose properties are already encoded (a proxy
        encoded and checked them): the same checks of what the store needs, the same
        records byte for byte, all or nothing."""
        ...

    def add_batch_listener(self, listener: Callable[[list[AppendResult]], None]) -> None:
        """Call ``listener`` once for each batch of messages that become visible together
        (one append, or one flush under ``sync``), with their results in log order.

        The same rules as :meth:`add_listener`. For a listener that only needs
        to know *which* queues grew, it costs one call per batch instead of one
        per message.
        """

    def stats(self) -> StoreStats: ...
