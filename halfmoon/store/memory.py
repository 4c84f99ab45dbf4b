"""``MemoryStore``: the in-memory twin of ``MessageStore`` for fast broker tests.

It keeps the :class:`~halfmoon.store.api.Store` contract to the letter where a
broker could notice: records get the commit-log offsets and sizes the real
record codec would give them, queue offsets are dense per (topic, queue id),
messages are validated by the real store's rules (``validate.py``) before
anything of a batch is written, reads honour the tag-hash filter and the
predicate with a bounded scan, and an offset below a queue's retained minimum
answers ``OFFSET_TOO_SMALL`` (use :meth:`MemoryStore.trim` to move it, as
retention would). Everything is durable at once: ``durable`` futures are
already complete.

Store timestamps come from an injectable clock so tests can query offsets by
time with a fake clock. ``offset_for_timestamp`` assumes store timestamps are
non-decreasing within a queue (true unless a test moves its clock backwards).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from halfmoon.errors import InvalidArgument, NotFound
from halfmoon.store import record
from halfmoon.store.api import (
    AppendResult,
    EncodedRecord,
    GetResult,
    GetStatus,
    MessagePredicate,
    StoreStats,
    TagHashes,
)
from halfmoon.store.fanout import check_destinations
from halfmoon.store.message import Message, StoredMessage, SysFlag, tag_hash
from halfmoon.store.validate import check_encoded, check_message, check_ranges

log = logging.getLogger(__name__)

# How many consume-queue entries one ``get`` examines at most (filters that
# match nothing cannot make one call walk a whole queue).
MAX_SCAN_ENTRIES = 2048
MAX_PROPERTIES_SIZE = 32 * 1024  # the real store's default (StoreConfig.max_properties_size)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class _Entry:
    commit_log_offset: int
    size: int
    tag_hash: int
    store_timestamp: int


class _Queue:
    __slots__ = ("min_offset", "base", "entries")

    def __init__(self) -> None:
        self.min_offset = 0  # first retained queue offset
        self.base = 0  # queue offset of entries[0]
        self.entries: list[_Entry] = []

    @property
    def max_offset(self) -> int:
        return self.base + len(self.entries)

    def entry(self, offset: int) -> _Entry:
        return self.entries[offset - self.base]


def _completed() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future


class MemoryStore:
    """An in-memory :class:`~halfmoon.store.api.Store`; thread-safe."""

    def __init__(
        self,
        clock: Callable[[], int] | None = None,
        *,
        max_body_size: int = 4 * 1024 * 1024,
        store_host: str = "127.0.0.1:8081",
    ) -> None:
        self._now_ms = clock if clock is not None else _wall_clock_ms
        self._max_body_size = max_body_size
        self._store_host = store_host
        self._lock = threading.RLock()
        self._records: dict[int, StoredMessage] = {}
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._listeners: list[Callable[[AppendResult], None]] = []
        self._batch_listeners: list[Callable[[list[AppendResult]], None]] = []
        self._next_offset = 0
        self._min_commit_log_offset = 0
        self._closed = False

    # -- lifecycle -------------------------------------------------------------
    def close(self) -> None:
        self._closed = True

    # -- writes ----------------------------------------------------------------
    def append_encoded(self, records: Sequence[EncodedRecord]) -> list[AppendResult]:
        """As :meth:`append`: the properties decoded back into each message (this store keeps
        messages, not records)."""
        messages = []
        for topic, queue_id, born_timestamp, born_host, body, properties, _, _ in records:
            check_encoded(
                topic, queue_id, body, properties, self._max_body_size, MAX_PROPERTIES_SIZE
            )
            messages.append(
                Message(
                    topic=topic,
                    body=body,
                    queue_id=queue_id,
                    properties=record.decode_properties(properties),
                    born_timestamp=born_timestamp,
                    born_host=born_host,
                )
            )
        return self.append(messages)

    def append(self, messages: Sequence[Message]) -> list[AppendResult]:
        prepared = []
        for message in messages:
            check_message(message, self._max_body_size, MAX_PROPERTIES_SIZE)
            try:
                prepared.append(record.prepare(message, self._store_host).size)
            except (ValueError, UnicodeEncodeError, OverflowError) as exc:
                check_ranges(message)
                raise InvalidArgument(f"message cannot be stored: {exc}") from exc
        results: list[AppendResult] = []
        with self._lock:
            if self._closed:
                raise InvalidArgument("the store is closed")
            for message, size in zip(messages, prepared, strict=True):
                now = self._now_ms()
                key = (message.topic, message.queue_id)
                queue = self._queues.get(key)
                if queue is None:
                    queue = self._queues[key] = _Queue()
                clo = self._next_offset
                self._next_offset += size
                queue_offset = queue.max_offset
                queue.entries.append(_Entry(clo, size, tag_hash(message.tags), now))
                self._records[clo] = StoredMessage(
                    topic=message.topic,
                    body=bytes(message.body),
                    queue_id=message.queue_id,
                    queue_offset=queue_offset,
                    commit_log_offset=clo,
                    size=size,
                    properties=dict(message.properties),
                    flags=message.flags,
                    sys_flag=message.sys_flag,
                    born_timestamp=message.born_timestamp,
                    born_host=message.born_host,
                    store_timestamp=now,
                    store_host=self._store_host,
                    reconsume_times=message.reconsume_times,
                    prepared_transaction_offset=message.prepared_transaction_offset,
                )
                results.append(
                    AppendResult(message.topic, message.queue_id, queue_offset, clo, size, now)
                )
            listeners = list(self._listeners)
            batch_listeners = list(self._batch_listeners)
        for batch_listener in batch_listeners:
            try:
                batch_listener(results)
            except Exception:  # a listener must not break appends; log and keep it
                log.exception("store listener failed")
        for result in results:
            for listener in listeners:
                try:
                    listener(result)
                except Exception:  # a listener must not break appends; log and keep it
                    log.exception("store listener failed")
        return results

    def append_fanout(
        self, message: Message, others: Sequence[tuple[str, int]]
    ) -> list[AppendResult]:
        """As the real store's: one record, an entry in each destination's queue."""
        if not others:
            return self.append([message])
        destinations = check_destinations(message, others)
        check_message(message, self._max_body_size, MAX_PROPERTIES_SIZE)
        try:
            buffer = record.prepare(message, self._store_host).buffer
            record.add_destinations(buffer, message.topic, list(others))
        except (ValueError, UnicodeEncodeError, OverflowError) as exc:
            check_ranges(message)
            raise InvalidArgument(f"message cannot be stored: {exc}") from exc
        size = len(buffer)
        with self._lock:
            if self._closed:
                raise InvalidArgument("the store is closed")
            now = self._now_ms()
            clo = self._next_offset
            self._next_offset += size
            placements = []
            for key in destinations:
                queue = self._queues.get(key)
                if queue is None:
                    queue = self._queues[key] = _Queue()
                placements.append((key[0], key[1], queue.max_offset))
                queue.entries.append(_Entry(clo, size, tag_hash(message.tags), now))
            self._records[clo] = StoredMessage(
                topic=message.topic,
                body=bytes(message.body),
                queue_id=message.queue_id,
                queue_offset=placements[0][2],
                commit_log_offset=clo,
                size=size,
                properties=dict(message.properties),
                flags=message.flags,
                sys_flag=message.sys_flag & ~SysFlag.DESTINATIONS,
                born_timestamp=message.born_timestamp,
                born_host=message.born_host,
                store_timestamp=now,
                store_host=self._store_host,
                reconsume_times=message.reconsume_times,
                prepared_transaction_offset=message.prepared_transaction_offset,
                destinations=tuple(placements[1:]),
            )
            results = [AppendResult(t, q, o, clo, size, now) for t, q, o in placements]
            listeners = list(self._listeners)
            batch_listeners = list(self._batch_listeners)
        for batch_listener in batch_listeners:
            try:
                batch_listener(results)
            except Exception:  # a listener must not break appends; log and keep it
                log.exception("store listener failed")
        for result in results:
            for listener in listeners:
                try:
                    listener(result)
                except Exception:  # a listener must not break appends; log and keep it
                    log.exception("store listener failed")
        return results

    def durable(self, end_offset: int) -> Future[None]:
        return _completed()

    def wait_durable(self, end_offset: int, timeout: float | None = None) -> bool:
        return True

    def put(self, messages: Sequence[Message]) -> list[AppendResult]:
        return self.append(messages)

    # -- reads -----------------------------------------------------------------
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
        with self._lock:
            queue = self._queues.get((topic, queue_id))
            if queue is None:
                return GetResult(GetStatus.NO_SUCH_QUEUE, [], 0, 0, 0)
            low, high = queue.min_offset, queue.max_offset
            if offset < low:
                return GetResult(GetStatus.OFFSET_TOO_SMALL, [], low, low, high)
            if offset > high:
                return GetResult(GetStatus.OFFSET_OVERFLOW, [], high, low, high)
            if offset == high:
                return GetResult(GetStatus.NO_MESSAGE, [], offset, low, high)
            candidates = []
            position = offset
            stop = min(high, offset + MAX_SCAN_ENTRIES)
            while position < stop:
                entry = queue.entry(position)
                position += 1
                if tag_hashes is not None and entry.tag_hash not in tag_hashes:
                    continue
                stored = self._records[entry.commit_log_offset]
                if stored.destinations:  # a fanout record: as this queue holds it
                    stored = stored.at(topic, queue_id, position - 1) or stored
                candidates.append((position, stored))
        # The predicate runs outside the lock: it may be slow (SQL92).
        messages: list[StoredMessage] = []
        next_offset = position
        total_bytes = 0
        for after, stored in candidates:
            if predicate is not None and not predicate(stored):
                continue
            if messages and total_bytes + stored.size > max_bytes:
                next_offset = stored.queue_offset
                break
            messages.append(stored)
            total_bytes += stored.size
            if len(messages) >= max_messages:
                next_offset = after
                break
        status = GetStatus.FOUND if messages else GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, messages, next_offset, low, high)

    def read_at(self, commit_log_offset: int) -> StoredMessage:
        with self._lock:
            stored = self._records.get(commit_log_offset)
        if stored is None:
            raise NotFound(
                f"no message starts at commit-log offset {commit_log_offset}",
                code="MESSAGE_NOT_FOUND",
            )
        return stored

    def query_by_key(
        self,
        topic: str,
        key: str,
        begin_timestamp: int = 0,
        end_timestamp: int = 2**63 - 1,
        max_results: int = 64,
    ) -> list[StoredMessage]:
        with self._lock:
            in_topic = (m.in_topic(topic) for m in reversed(self._records.values()))
            found = [
                m
                for m in in_topic
                if m is not None
                and begin_timestamp <= m.store_timestamp <= end_timestamp
                and (key in m.keys or m.unique_id == key)
            ]
        return found[:max_results]

    # -- queues ----------------------------------------------------------------
    def min_offset(self, topic: str, queue_id: int) -> int:
        queue = self._queues.get((topic, queue_id))
        return queue.min_offset if queue else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        queue = self._queues.get((topic, queue_id))
        return queue.max_offset if queue else 0

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp: int) -> int:
        with self._lock:
            queue = self._queues.get((topic, queue_id))
            if queue is None:
                return 0
            start = queue.min_offset - queue.base
            stamps = [e.store_timestamp for e in queue.entries[start:]]
            return queue.min_offset + bisect.bisect_left(stamps, timestamp)

    def queues(self) -> Iterable[tuple[str, int]]:
        with self._lock:
            return list(self._queues)

    def delete_topic(self, topic: str) -> None:
        with self._lock:
            for key in [k for k in self._queues if k[0] == topic]:
                del self._queues[key]

    def add_listener(self, listener: Callable[[AppendResult], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def add_batch_listener(self, listener: Callable[[list[AppendResult]], None]) -> None:
        with self._lock:
            self._batch_listeners.append(listener)

    def stats(self) -> StoreStats:
        with self._lock:
            live = sum(m.size for m in self._records.values())
            return StoreStats(
                commit_log_min_offset=self._min_commit_log_offset,
                commit_log_max_offset=self._next_offset,
                commit_log_flushed_offset=self._next_offset,
                disk_bytes=live,
                segments=1 if self._records else 0,
                queues=len(self._queues),
            )

    # -- test helpers ----------------------------------------------------------
    def trim(self, topic: str, queue_id: int, below: int) -> None:
        """Forget a queue's entries below queue offset ``below``, as retention would.

        Their records become unreadable by ``read_at`` too. Reads below the new
        minimum answer ``OFFSET_TOO_SMALL``.
        """
        with self._lock:
            queue = self._queues.get((topic, queue_id))
            if queue is None:
                return
            below = min(below, queue.max_offset)
            for offset in range(queue.min_offset, below):
                self._records.pop(queue.entry(offset).commit_log_offset, None)
            queue.min_offset = max(queue.min_offset, below)
