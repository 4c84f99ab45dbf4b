"""The store's write path: a producer's messages, or a master's chunk of log copied as it is.

Messages are validated and encoded outside the append lock; under it each
record gets its queue offset (from ``Visibility.next_offsets``), its
commit-log offset and store timestamp, is copied into the log and dispatched
to its consume queue and the key index. What happens after (the flusher
woken, or the listeners told) is :class:`~halfmoon.store.visibility.Visibility`'s.
"""

from __future__ import annotations

import functools
import struct
import threading
from collections.abc import Callable, Sequence

from halfmoon.errors import StorageError
from halfmoon.store import fanout, record
from halfmoon.store.api import AppendResult, EncodedRecord, new_append_result
from halfmoon.store.commitlog import CommitLog
from halfmoon.store.config import StoreConfig
from halfmoon.store.consumequeue import ConsumeQueues
from halfmoon.store.keyindex import KeyIndex
from halfmoon.store.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQUE_ID,
    Message,
    tag_hash,
)
from halfmoon.store.recovery import dispatch, index_keys
from halfmoon.store.shipping import ShippedDataError, parse_chunk
from halfmoon.store.validate import (
    IllegalMessageField,
    MessageBodyTooLarge,
    check_encoded,
    check_message,
    check_ranges,
)
from halfmoon.store.visibility import Visibility

_cached_tag_hash = functools.lru_cache(maxsize=4096)(tag_hash)

# What ``prepare`` hands to the locked part of ``append``: the unsealed record,
# topic, queue id, tag hash and the keys to index. A tuple, not an object:
# this is built once per appended message.
_Prepared = tuple[bytearray, str, int, int, Sequence[str]]


class StoreClosed(StorageError):
    code = "STORE_CLOSED"
    protocol_code = "INTERNAL_ERROR"


def closed_error() -> StoreClosed:
    return StoreClosed("the store is closed; open a new MessageStore")


class Writer:
    """Appends into one store's log, consume queues and key index, under its append lock.

    Closing the writer (:meth:`close`) is what closes the store to writes; the
    store's other parts read :attr:`closed` under the same lock.
    """

    def __init__(
        self,
        config: StoreConfig,
        commitlog: CommitLog,
        queues: ConsumeQueues,
        index: KeyIndex,
        lock: threading.Lock,
        visibility: Visibility,
        clock: Callable[[], float],
    ) -> None:
        self._commitlog = commitlog
        self._queues = queues
        self._index = index
        self._lock = lock
        self._visibility = visibility
        self._clock = clock  # seconds since the epoch: the records' store timestamps
        self._body_limit = config.max_body_size
        self._properties_limit = config.max_properties_size
        self._record_limit = config.segment_size
        self._store_host = config.store_host
        self.closed = False
        self.appends = 0  # records appended (a fanout record once), for stats

    def close(self) -> bool:
        """Refuse every later write; False if the writer was closed already."""
        with self._lock:
            if self.closed:
                return False
            self.closed = True
            return True

    # -- before the lock -----------------------------------------------------

    def _too_large(self, size: int) -> MessageBodyTooLarge:
        return MessageBodyTooLarge(
            f"the record of {size} bytes does not fit in a commit-log segment of "
            f"{self._record_limit} bytes; send a smaller message or raise segment_size"
        )

    def prepare(self, messages: Sequence[Message]) -> list[_Prepared]:
        """Validate and encode every message of a batch before anything is written.

        Runs outside the append lock. Besides the unsealed record it computes
        what dispatch needs (tag hash, index keys), so the locked part of
        ``append`` does no per-message property work.
        """
        body_limit, properties_limit = self._body_limit, self._properties_limit
        store_host, record_limit = self._store_host, self._record_limit
        prepared: list[_Prepared] = []
        for message in messages:
            encoded = check_message(message, body_limit, properties_limit)
            try:
                buffer = record.encode_unsealed(message, store_host, encoded)
            except (struct.error, ValueError, TypeError, OverflowError) as exc:
                check_ranges(message)
                raise IllegalMessageField(f"message cannot be encoded: {exc}") from None
            if len(buffer) > record_limit:
                raise self._too_large(len(buffer))
            properties = message.properties
            if encoded:  # empty only when there are no properties
                tag = _cached_tag_hash(properties.get(PROPERTY_TAGS))
                if PROPERTY_KEYS in properties:
                    keys: Sequence[str] = index_keys(properties)
                else:  # the usual case: only the unique id is indexed
                    unique = properties.get(PROPERTY_UNIQUE_ID)
                    keys = (unique,) if unique else ()
            else:
                tag, keys = 0, ()
            prepared.append((buffer, message.topic, message.queue_id, tag, keys))
        return prepared

    def prepare_encoded(self, records: Sequence[EncodedRecord]) -> list[_Prepared]:
        """:meth:`prepare` for messages whose properties are already encoded."""
        body_limit, properties_limit = self._body_limit, self._properties_limit
        store_host, record_limit = self._store_host, self._record_limit
        prepared: list[_Prepared] = []
        for topic, queue_id, born_timestamp, born_host, body, properties, tag, keys in records:
            check_encoded(topic, queue_id, body, properties, body_limit, properties_limit)
            try:
                buffer = record.encode_unsealed_plain(
                    topic, queue_id, born_timestamp, born_host, body, properties, store_host
                )
            except (struct.error, ValueError, TypeError, OverflowError, AttributeError) as exc:
                raise IllegalMessageField(f"message cannot be encoded: {exc}") from None
            if len(buffer) > record_limit:
                raise self._too_large(len(buffer))
            prepared.append((buffer, topic, queue_id, _cached_tag_hash(tag), keys))
        return prepared

    # -- appends -------------------------------------------------------------

    def append(self, messages: Sequence[Message]) -> list[AppendResult]:
        if not messages:
            return []
        return self._write(self.prepare(messages))

    def append_encoded(self, records: Sequence[EncodedRecord]) -> list[AppendResult]:
        if not records:
            return []
        return self._write(self.prepare_encoded(records))

    def append_fanout(
        self, message: Message, others: Sequence[tuple[str, int]]
    ) -> list[AppendResult]:
        """Append ``message`` once, indexed into its own queue and each of ``others``
        (topic, queue id): one record, one consume-queue entry per destination, each with
        its own queue offset. The results, one per destination, its own first, share the
        record's commit-log offset and size."""
        if not others:
            return self.append([message])
        destinations = fanout.check_destinations(message, others)
        (buffer, topic, queue_id, tag, keys) = self.prepare([message])[0]
        try:
            positions = record.add_destinations(buffer, message.topic, list(others))
        except (ValueError, UnicodeEncodeError) as exc:
            raise IllegalMessageField(f"destinations cannot be encoded: {exc}") from None
        if len(buffer) > self._record_limit:
            raise self._too_large(len(buffer))
        visibility = self._visibility
        offsets = visibility.next_offsets
        with self._lock:
            if self.closed:
                raise closed_error()
            now = int(self._clock() * 1000)
            queue_offsets = [offsets.get(d, 0) for d in destinations]
            for at, queue_offset in zip(positions, queue_offsets[1:], strict=True):
                record.fill_destination_offset(buffer, at, queue_offset)
            try:
                position = self._commitlog.write_record(buffer, queue_offsets[0], now)
            except OSError as exc:
                raise StorageError(f"the commit log refused a write: {exc}") from exc
            size = len(buffer)
            results = []
            for (t, q), queue_offset in zip(destinations, queue_offsets, strict=True):
                offsets[(t, q)] = queue_offset + 1
                self._queues.put(t, q, queue_offset, position, size, tag)
                results.append(new_append_result(t, q, queue_offset, position, size, now))
            for t in dict.fromkeys(t for t, _ in destinations):
                if keys:
                    self._index.put_keys(t, keys, position, now)
            self.appends += 1
            visibility.hold(results)
        visibility.written(results)
        return results

    def _write(self, prepared: list[_Prepared]) -> list[AppendResult]:
        """The locked part of an append: seal and write each record, dispatch it."""
        results: list[AppendResult] = []
        write = self._commitlog.write_record
        queue_put = self._queues.put
        index_put = self._index.put_keys
        visibility = self._visibility
        offsets = visibility.next_offsets
        with self._lock:
            if self.closed:
                raise closed_error()
            now = int(self._clock() * 1000)
            for buffer, topic, queue_id, tag, keys in prepared:
                key = (topic, queue_id)
                queue_offset = offsets.get(key, 0)
                try:
                    position = write(buffer, queue_offset, now)
                except OSError as exc:
                    raise StorageError(f"the commit log refused a write: {exc}") from exc
                offsets[key] = queue_offset + 1
                size = len(buffer)
                queue_put(topic, queue_id, queue_offset, position, size, tag)
                if keys:
                    index_put(topic, keys, position, now)
                results.append(
                    new_append_result(topic, queue_id, queue_offset, position, size, now)
                )
            self.appends += len(results)
            visibility.hold(results)
        visibility.written(results)
        return results

    def append_replicated(self, position: int, data: bytes) -> list[AppendResult]:
        """Append a chunk of a master's commit log at ``position`` (this store is a replica).

        The bytes are written unchanged (the log stays identical to the
        master's) and each message is dispatched to its consume queue and the
        key index by recovery's own ``dispatch``. Every record is checked
        first (``shipping.parse_chunk``): a bad chunk raises and nothing of it
        is written. Durability and visibility follow the flush policy, as for
        :meth:`append`, except that the write listeners are not told.
        """
        messages = parse_chunk(data, position, self._commitlog.segment_size)
        results: list[AppendResult] = []
        visibility = self._visibility
        offsets = visibility.next_offsets
        with self._lock:
            if self.closed:
                raise closed_error()
            try:
                self._commitlog.write_raw(position, data)
            except ValueError as exc:
                raise ShippedDataError(f"a chunk the log cannot take: {exc}") from None
            except OSError as exc:
                raise StorageError(f"the commit log refused a write: {exc}") from exc
            for message in messages:
                dispatch(message, self._queues, self._index)
                for topic, queue_id, queue_offset in message.placements():
                    offsets[(topic, queue_id)] = queue_offset + 1
                    results.append(
                        new_append_result(
                            topic, queue_id, queue_offset,
                            message.commit_log_offset, message.size, message.store_timestamp,
                        )
                    )  # fmt: skip
            self.appends += len(results)
            visibility.hold(results)
        visibility.written(results, tell_writers=False)
        return results
