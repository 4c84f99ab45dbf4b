"""MessageStore: the commit log, consume queues and key index behind the ``Store`` protocol.

Open it with ``MessageStore(StoreConfig(data_dir=...))``; close it (or use it
as a context manager) for a clean shutdown. Opening recovers (see
``recovery``).

Writes: messages are validated and encoded outside the append lock; under it
each record gets its queue offset (from the per-queue offset table), its
commit-log offset and store timestamp, is copied into the log and dispatched
to its consume queue and the key index. Under ``sync`` the records become
visible to reads and listeners only after the flusher's fsync covers them.

Background threads: the flusher (``flush``) and one maintenance thread that
writes a checkpoint every ``checkpoint_interval`` seconds (when something
changed) and runs retention every ``retention_check_interval`` seconds.
"""

from __future__ import annotations

import collections
import functools
import logging
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future

from halfmoon.errors import NotFound, StorageError
from halfmoon.store import record
from halfmoon.store.api import (
    AppendResult,
    EncodedRecord,
    GetResult,
    GetStatus,
    MessagePredicate,
    StoreStats,
    TagHashes,
    new_append_result,
)
from halfmoon.store.checkpoint import (
    Checkpoint,
    mark_clean_close,
    mark_open,
    read_checkpoint,
    write_checkpoint,
)
from halfmoon.store.commitlog import CommitLog, OffsetGone
from halfmoon.store.config import StoreConfig
from halfmoon.store.consumequeue import ConsumeQueues
from halfmoon.store.flush import GroupCommitFlusher, IntervalFlusher
from halfmoon.store.keyindex import KeyIndex
from halfmoon.store.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQUE_ID,
    Message,
    StoredMessage,
    tag_hash,
)
from halfmoon.store.recovery import (
    RecoveryReport,
    Reporter,
    dispatch,
    index_keys,
    log_reporter,
    recover,
)
from halfmoon.store.retention import disk_usage_ratio, next_expired
from halfmoon.store.shipping import ShippedDataError, parse_chunk, read_chunk
from halfmoon.store.truncation import (
    TruncationRefused,
    capped,
    clear_intent,
    failpoint,
    read_intent,
    write_intent,
)
from halfmoon.store.validate import (
    IllegalMessageField,
    MessageBodyTooLarge,
    check_encoded,
    check_message,
    check_ranges,
)

log = logging.getLogger("halfmoon.store")

_cached_tag_hash = functools.lru_cache(maxsize=4096)(tag_hash)

# What ``_prepare`` hands to the locked part of ``append``: the unsealed record,
# topic, queue id, tag hash and the keys to index. A tuple, not an object:
# this is built once per appended message.
_Prepared = tuple[bytearray, str, int, int, Sequence[str]]


class MessageNotFound(NotFound):
    code = "MESSAGE_NOT_FOUND"


class StoreClosed(StorageError):
    code = "STORE_CLOSED"
    protocol_code = "INTERNAL_ERROR"


class MessageStore:
    """The file-backed store. Thread-safe; see the module docstring."""

    def __init__(
        self,
        config: StoreConfig,
        *,
        reporter: Reporter | None = None,
        clock: Callable[[], float] = time.time,
        disk_usage: Callable[[], float] | None = None,
    ) -> None:
        self.config = config
        self._clock = clock  # seconds since the epoch: store timestamps and retention
        root = config.data_dir
        root.mkdir(parents=True, exist_ok=True)
        self._disk_usage = disk_usage or (lambda: disk_usage_ratio(root))
        self._lock = threading.Lock()  # the append lock: offsets, writes, dispatch
        self._checkpoint_lock = threading.Lock()
        self._listeners: list[Callable[[AppendResult], None]] = []
        self._batch_listeners: list[Callable[[list[AppendResult]], None]] = []
        self._write_listeners: list[Callable[[], None]] = []
        self._closed = False
        self._sync = config.flush == "sync"
        self._appends = 0
        self._retention_deleted = 0
        checkpoint = read_checkpoint(root)
        crashed = mark_open(root)
        index_missing = not (root / "index").is_dir()
        self._commitlog = CommitLog(root / "commitlog", config.segment_size)
        self._queues = ConsumeQueues(root / "consumequeue", config.cq_entries_per_file)
        self._index = KeyIndex(root / "index", config.index_slots, config.index_max_entries)
        try:
            cut = read_intent(root)
            if cut is not None:
                # A truncation was under way (``truncation``): finish cutting the log before
                # recovery can see its tail, and recover as after a crash from a checkpoint
                # that cannot point past the cut.
                log.warning("event=truncation_resumed offset=%d", cut)
                self._commitlog.truncate(cut)
                checkpoint, crashed = capped(checkpoint, cut), True
            self.recovery: RecoveryReport = recover(
                self._commitlog, self._queues, self._index, checkpoint,
                data_dir=root, crashed=crashed, index_missing=index_missing,
                policy=config.recovery, reporter=reporter or log_reporter,
            )  # fmt: skip
        except BaseException:
            self._close_files()
            raise
        # The topic-queue offset table: next queue offset to assign, per queue.
        self._next_offsets: dict[tuple[str, int], int] = self._queues.max_offsets()
        # Visible max offsets: a separate table under sync (advanced by the flusher).
        self._visible = dict(self._next_offsets) if self._sync else self._next_offsets
        self._visible_position = self._commitlog.write_position
        self._pending: collections.deque[AppendResult] = collections.deque()
        self._body_limit = config.max_body_size
        self._record_limit = config.segment_size
        self._flusher: GroupCommitFlusher | IntervalFlusher
        if self._sync:
            self._flusher = GroupCommitFlusher(self._commitlog, self._on_flushed)
        else:
            self._flusher = IntervalFlusher(
                self._commitlog, config.flush_interval, self._on_flushed
            )
        self._last_checkpoint: tuple[int, int] = (-1, -1)
        self.write_checkpoint()
        if cut is not None:
            clear_intent(root)  # the checkpoint just written is at or below the cut
        self._stop = threading.Event()
        self._maintenance = threading.Thread(
            target=self._maintain, name="halfmoon-store-maintenance", daemon=True
        )
        self._maintenance.start()

    # -- lifecycle -----------------------------------------------------------

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._maintenance.join()
        self._flusher.close()
        self.write_checkpoint(force=True)
        self._close_files()
        mark_clean_close(self.config.data_dir)

    def _close_files(self) -> None:
        self._queues.close()
        self._index.close()
        self._commitlog.close()

    def _maintain(self) -> None:
        config = self.config
        tick = min(config.checkpoint_interval, config.retention_check_interval)
        next_retention = time.monotonic() + config.retention_check_interval
        while not self._stop.wait(tick):
            try:
                self.write_checkpoint()
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + config.retention_check_interval
                    self.run_retention()
            except Exception:  # keep the store running; the next round retries
                log.exception("event=maintenance_failed")

    def write_checkpoint(self, force: bool = False) -> None:
        """Flush log, queues and index up to the current end and record it in the checkpoint."""
        with self._checkpoint_lock:
            self._write_checkpoint_locked(force)

    def _write_checkpoint_locked(self, force: bool) -> None:
        with self._lock:
            dispatched = self._commitlog.write_position
            queue_offsets = dict(self._next_offsets)
        state = (dispatched, len(queue_offsets))
        if state == self._last_checkpoint and not force:
            return
        if self._sync and not self._closed:
            self._flusher.wait(dispatched)
        else:
            self._commitlog.sync(dispatched)
        self._queues.flush()
        self._index.flush()
        flushed = max(self._commitlog.flushed_position, dispatched)
        now = int(self._clock() * 1000)
        write_checkpoint(self.config.data_dir, Checkpoint(flushed, dispatched, now, queue_offsets))
        self._last_checkpoint = state

    # -- writes --------------------------------------------------------------

    def _prepare(self, messages: Sequence[Message]) -> list[_Prepared]:
        """Validate and encode every message of a batch before anything is written.

        Runs outside the append lock. Besides the unsealed record it computes
        what dispatch needs (tag hash, index keys), so the locked part of
        ``append`` does no per-message property work.
        """
        body_limit, properties_limit = self._body_limit, self.config.max_properties_size
        store_host = self.config.store_host
        prepared: list[_Prepared] = []
        for message in messages:
            encoded = check_message(message, body_limit, properties_limit)
            try:
                buffer = record.encode_unsealed(message, store_host, encoded)
            except (struct.error, ValueError, TypeError, OverflowError) as exc:
                check_ranges(message)
                raise IllegalMessageField(f"message cannot be encoded: {exc}") from None
            if len(buffer) > self._record_limit:
                raise MessageBodyTooLarge(
                    f"the record of {len(buffer)} bytes does not fit in a commit-log segment of "
                    f"{self._record_limit} bytes; send a smaller message or raise segment_size"
                )
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

    def _prepare_encoded(self, records: Sequence[EncodedRecord]) -> list[_Prepared]:
        """:meth:`_prepare` for messages whose properties are already encoded."""
        body_limit, properties_limit = self._body_limit, self.config.max_properties_size
        store_host = self.config.store_host
        prepared: list[_Prepared] = []
        for topic, queue_id, born_timestamp, born_host, body, properties, tag, keys in records:
            check_encoded(topic, queue_id, body, properties, body_limit, properties_limit)
            try:
                buffer = record.encode_unsealed_plain(
                    topic, queue_id, born_timestamp, born_host, body, properties, store_host
                )
            except (struct.error, ValueError, TypeError, OverflowError, AttributeError) as exc:
                raise IllegalMessageField(f"message cannot be encoded: {exc}") from None
            if len(buffer) > self._record_limit:
                raise MessageBodyTooLarge(
                    f"the record of {len(buffer)} bytes does not fit in a commit-log segment of "
                    f"{self._record_limit} bytes; send a smaller message or raise segment_size"
                )
            prepared.append((buffer, topic, queue_id, _cached_tag_hash(tag), keys))
        return prepared

    def append(self, messages: Sequence[Message]) -> list[AppendResult]:
        if not messages:
            return []
        return self._write(self._prepare(messages))

    def append_encoded(self, records: Sequence[EncodedRecord]) -> list[AppendResult]:
        if not records:
            return []
        return self._write(self._prepare_encoded(records))

    def _write(self, prepared: list[_Prepared]) -> list[AppendResult]:
        """The locked part of an append: seal and write each record, dispatch it."""
        results: list[AppendResult] = []
        write = self._commitlog.write_record
        queue_put = self._queues.put
        index_put = self._index.put_keys
        offsets = self._next_offsets
        with self._lock:
            if self._closed:
                raise StoreClosed("the store is closed; open a new MessageStore")
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
            self._appends += len(results)
            if self._sync:
                self._pending.extend(results)
        if self._sync:
            self._flusher.written()
            for written in self._write_listeners:
                written()
        else:
            self._visible_position = self._commitlog.write_position
            if self._listeners or self._batch_listeners:
                self._notify(results)
        return results

    def append_replicated(self, position: int, data: bytes) -> list[AppendResult]:
        """Append a chunk of a master's commit log at ``position`` (this store is a replica).

        The bytes are written unchanged (the log stays identical to the
        master's) and each message is dispatched to its consume queue and the
        key index by recovery's own ``dispatch``. Every record is checked
        first (``shipping.parse_chunk``): a bad chunk raises and nothing of it
        is written. Durability and visibility follow the flush policy, as for
        :meth:`append`.
        """
        messages = parse_chunk(data, position, self._commitlog.segment_size)
        results: list[AppendResult] = []
        offsets = self._next_offsets
        with self._lock:
            if self._closed:
                raise StoreClosed("the store is closed; open a new MessageStore")
            try:
                self._commitlog.write_raw(position, data)
            except ValueError as exc:
                raise ShippedDataError(f"a chunk the log cannot take: {exc}") from None
            except OSError as exc:
                raise StorageError(f"the commit log refused a write: {exc}") from exc
            for message in messages:
                dispatch(message, self._queues, self._index)
                offsets[(message.topic, message.queue_id)] = message.queue_offset + 1
                results.append(
                    new_append_result(
                        message.topic, message.queue_id, message.queue_offset,
                        message.commit_log_offset, message.size, message.store_timestamp,
                    )
                )  # fmt: skip
            self._appends += len(results)
            if self._sync:
                self._pending.extend(results)
        if self._sync:
            self._flusher.written()
        else:
            self._visible_position = self._commitlog.write_position
            if self._listeners or self._batch_listeners:
                self._notify(results)
        return results

    def truncate(self, offset: int) -> int:
        """Cut the log at ``offset`` and everything derived from it; the new end.

        For a replica whose log diverged from its master's: ``offset`` is a
        record boundary both logs share (replication finds it from the epoch
        tables). Consume-queue and key-index entries at or after it are
        dropped, the queues' next offsets taken from what is left, and a
        checkpoint at the new end written. Crash-safe through an intent
        marker written first and removed last (``truncation``). Nothing else
        may write meanwhile (a replica's only writer is its follower, which
        calls this). Listeners hear nothing: what they were told of past
        ``offset`` is simply gone.
        """
        root = self.config.data_dir
        with self._checkpoint_lock:
            if offset >= self._commitlog.write_position:
                return self._commitlog.write_position
            if offset < self._commitlog.min_offset:
                raise TruncationRefused(
                    f"cannot cut the log at {offset}, below its retained start "
                    f"{self._commitlog.min_offset}: start this member on an empty data directory"
                )
            write_intent(root, offset)
            # The flusher is stopped across the cut (closing it flushes what is written), so
            # none of its positions, waiters or fsyncs refer to bytes that are going.
            self._flusher.close()
            with self._lock:
                if self._closed:
                    raise StoreClosed("the store is closed; open a new MessageStore")
                self._commitlog.truncate(offset)
                failpoint("truncate-after-log")
                self._queues.truncate_from(offset)
                self._index.truncate_from(offset)
                self._next_offsets = self._queues.max_offsets()
                self._visible = dict(self._next_offsets) if self._sync else self._next_offsets
                self._visible_position = offset
                self._pending.clear()
                if self._sync:
                    self._flusher = GroupCommitFlusher(self._commitlog, self._on_flushed)
                else:
                    self._flusher = IntervalFlusher(
                        self._commitlog, self.config.flush_interval, self._on_flushed
                    )
            self._write_checkpoint_locked(force=True)
            failpoint("truncate-before-clear")
            clear_intent(root)
        log.warning("event=store_truncated offset=%d", offset)
        return offset

    def read_shipment(self, position: int, max_bytes: int) -> bytes:
        """The next chunk of this (a master's) log to ship from ``position``, cut as
        ``shipping.read_chunk`` says; empty when nothing new was written.

        Written bytes, not only durable ones (as Kafka's and RocketMQ's replication do): a
        replica's fsync then runs while the master's does instead of after it. Nothing is
        acknowledged before both are durable. A replica holding bytes its master lost (a
        power failure) cuts them when it follows again: a master appointed anew always
        starts a new epoch, and the replica asks where its epoch ended."""
        return read_chunk(self._commitlog, position, self._commitlog.write_position, max_bytes)

    @property
    def segment_size(self) -> int:
        return self._commitlog.segment_size

    @property
    def end_offset(self) -> int:
        """Where the next record goes: a replica fetches from here."""
        return self._commitlog.write_position

    @property
    def visible_offset(self) -> int:
        """The end of what readers (and replicas) may see: flushed under ``sync``."""
        return self._visible_position

    def durable(self, end_offset: int) -> Future[None]:
        return self._flusher.durable(end_offset)

    def wait_durable(self, end_offset: int, timeout: float | None = None) -> bool:
        return self._flusher.wait(end_offset, timeout)

    def put(self, messages: Sequence[Message]) -> list[AppendResult]:
        results = self.append(messages)
        if results and self._sync:
            self._flusher.wait(results[-1].end_offset)
        return results

    def _on_flushed(self, position: int) -> None:
        if not self._sync:
            return
        pending, visible, known = self._pending, self._visible, self._next_offsets
        ready = []
        # Under the append lock: the fsync may cover a record whose append is still between
        # its write and adding it to ``pending``; unlocked, that record was skipped here, then
        # durable (acknowledged) but invisible, its consumers not woken, until the next fsync.
        with self._lock:
            while pending and pending[0].end_offset <= position:
                result = pending.popleft()
                key = (result.topic, result.queue_id)
                if key in known:  # not deleted meanwhile
                    visible[key] = result.queue_offset + 1
                ready.append(result)
            self._visible_position = position
        if ready and (self._listeners or self._batch_listeners):
            self._notify(ready)

    def add_listener(self, listener: Callable[[AppendResult], None]) -> None:
        self._listeners = [*self._listeners, listener]

    def add_batch_listener(self, listener: Callable[[list[AppendResult]], None]) -> None:
        self._batch_listeners = [*self._batch_listeners, listener]

    def add_write_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after each append is written, before it is durable (under
        ``sync``; under ``async`` a write is visible at once and :meth:`add_listener`'s
        listeners are told)."""
        self._write_listeners = [*self._write_listeners, listener]

    def _notify(self, results: list[AppendResult]) -> None:
        for batch_listener in self._batch_listeners:
            try:
                batch_listener(results)
            except Exception:
                log.exception("event=listener_failed listener=%r", batch_listener)
        for listener in self._listeners:
            for result in results:
                try:
                    listener(result)
                except Exception:
                    log.exception("event=listener_failed listener=%r", listener)

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
        below: int | None = None,
    ) -> GetResult:
        """``below``: a commit-log offset; the queue is read as if it ended at its first
        entry whose record does not end at or before it (a replica's committed point)."""
        key = (topic, queue_id)
        max_offset = self._visible.get(key)
        if max_offset is None:
            return GetResult(GetStatus.NO_SUCH_QUEUE, [], 0, 0, 0)
        if below is not None:
            max_offset = self.max_offset_below(topic, queue_id, below)
        min_offset = min(self._queues.min_offset(topic, queue_id), max_offset)
        if offset < min_offset:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, [], min_offset, min_offset, max_offset)
        if offset >= max_offset:
            status = GetStatus.NO_MESSAGE if offset == max_offset else GetStatus.OFFSET_OVERFLOW
            return GetResult(status, [], max_offset, min_offset, max_offset)
        budget = min(max_offset - offset, max(max_messages, self.config.max_scan_entries))
        commitlog = self._commitlog
        # Records past this point may still be being written (read after max_offset).
        readable_end = commitlog.write_position
        decode = record.decode_at
        verify = self.config.verify_crc_on_read
        messages: list[StoredMessage] = []
        total = 0
        next_offset = offset
        examined = 0
        full = False
        # The segment of the previous record: consecutive entries almost always
        # share it, so the lookup runs once per segment, not once per message.
        segment_start = segment_end = 0
        mm: record.Buffer = b""  # set with the first segment (end > segment_end)
        while not full and examined < budget:
            # Fetch only what is likely needed: a filter-free read needs max_messages entries.
            want = min(budget - examined, max(max_messages - len(messages), 16))
            first, entries = self._queues.raw_entries(topic, queue_id, next_offset, want)
            if not entries:
                break
            if first > next_offset:  # trimmed since min_offset was read
                if not examined:
                    return GetResult(GetStatus.OFFSET_TOO_SMALL, [], first, first, max_offset)
                break
            examined += len(entries)
            queue_offset = first - 1
            for commit_log_offset, size, entry_tag in entries:
                queue_offset += 1
                if tag_hashes is not None and entry_tag not in tag_hashes:
                    next_offset = queue_offset + 1
                    continue
                if messages and total + size > max_bytes:
                    full = True
                    break
                next_offset = queue_offset + 1
                end = commit_log_offset + size
                try:
                    if not segment_start <= commit_log_offset or end > segment_end:
                        segment = commitlog.segment_for(commit_log_offset)
                        if segment is None:
                            raise OffsetGone(commit_log_offset)
                        segment_start, segment_end, mm = segment.start, segment.end, segment.mm
                    if end > readable_end:
                        raise OffsetGone(commit_log_offset)
                    relative = commit_log_offset - segment_start
                    # Decoded straight from the mapping: no intermediate copy.
                    message = decode(mm, relative, relative + size, verify, segment_start)
                except (OffsetGone, record.RecordError, ValueError) as exc:
                    # ValueError: the segment was closed by retention under our feet.
                    log.warning(
                        "event=unreadable_entry topic=%s queue_id=%d queue_offset=%d error=%r",
                        topic, queue_id, queue_offset, str(exc),
                    )  # fmt: skip
                    segment_start = segment_end = 0
                    continue
                if message.queue_offset != queue_offset or message.topic != topic:
                    log.warning(
                        "event=entry_mismatch topic=%s queue_id=%d queue_offset=%d",
                        topic, queue_id, queue_offset,
                    )  # fmt: skip
                    continue
                if predicate is not None and not predicate(message):
                    continue
                messages.append(message)
                total += size
                if len(messages) >= max_messages:
                    full = True
                    break
        if messages:
            status = GetStatus.FOUND
        elif examined:
            status = GetStatus.NO_MATCHED_MESSAGE
        else:
            status = GetStatus.NO_MESSAGE
        return GetResult(status, messages, next_offset, min_offset, max_offset)

    def read_at(self, commit_log_offset: int) -> StoredMessage:
        try:
            message = self._commitlog.read_message(commit_log_offset, verify=True)
        except OffsetGone:
            message = None
        if message is None or commit_log_offset + message.size > self._visible_position:
            raise MessageNotFound(
                f"no message starts at commit-log offset {commit_log_offset} (it may have "
                f"been deleted by retention; the log starts at {self._commitlog.min_offset})"
            )
        return message

    def query_by_key(
        self,
        topic: str,
        key: str,
        begin_timestamp: int = 0,
        end_timestamp: int = 2**63 - 1,
        max_results: int = 64,
    ) -> list[StoredMessage]:
        if max_results <= 0:
            return []
        candidates = self._index.query(
            topic, key, begin_timestamp, end_timestamp, max_results * 2 + 8
        )
        found: list[StoredMessage] = []
        for offset in candidates:
            try:
                message = self.read_at(offset)
            except MessageNotFound:
                continue
            if (
                message.topic != topic
                or not begin_timestamp <= message.store_timestamp <= end_timestamp
            ):
                continue
            if key in message.keys or message.unique_id == key:
                found.append(message)
                if len(found) >= max_results:
                    break
        return found

    # -- queues --------------------------------------------------------------

    def min_offset(self, topic: str, queue_id: int) -> int:
        if (topic, queue_id) not in self._visible:
            return 0
        return min(self._queues.min_offset(topic, queue_id), self._visible[(topic, queue_id)])

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._visible.get((topic, queue_id), 0)

    def max_offset_below(self, topic: str, queue_id: int, below: int) -> int:
        """The queue's end counting only entries whose records end at or before commit-log
        offset ``below``: a queue's records lie in the log in queue order, so a binary search
        over its entries finds the first one past ``below``."""
        high = self.max_offset(topic, queue_id)
        low = self._queues.min_offset(topic, queue_id)
        if low >= high:
            return high
        while low < high:  # invariant: every entry below `low` ends at or before `below`
            middle = (low + high) // 2
            first, entries = self._queues.raw_entries(topic, queue_id, middle, 1)
            if not entries or first != middle:  # trimmed meanwhile: count it as below
                low = middle + 1
                continue
            commit_log_offset, size, _ = entries[0]
            if commit_log_offset + size <= below:
                low = middle + 1
            else:
                high = middle
        return low

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp: int) -> int:
        max_offset = self.max_offset(topic, queue_id)
        if max_offset == 0:
            return 0

        def store_timestamp_of(commit_log_offset: int) -> int:
            try:
                return self._commitlog.store_timestamp_at(commit_log_offset)
            except OffsetGone:
                return -1  # deleted by retention: older than anything asked for

        found = self._queues.lookup_by_time(topic, queue_id, timestamp, store_timestamp_of)
        return min(found, max_offset)

    def queues(self) -> Iterable[tuple[str, int]]:
        return sorted(self._visible)

    def delete_topic(self, topic: str) -> None:
        with self._lock:
            self._queues.delete_topic(topic)
            for key in [k for k in self._next_offsets if k[0] == topic]:
                del self._next_offsets[key]
                self._visible.pop(key, None)
        self.write_checkpoint(force=True)  # so recovery does not rebuild what was deleted

    # -- retention -----------------------------------------------------------

    def run_retention(self, now: float | None = None) -> int:
        """Delete expired segments (``now``: seconds since the epoch); return how many."""
        config = self.config
        now_ms = int((self._clock() if now is None else now) * 1000)
        deleted = 0
        while True:
            found = next_expired(
                self._commitlog,
                now_ms=now_ms,
                retention_ms=int(config.retention_hours * 3600 * 1000),
                max_disk_ratio=config.disk_usage_ratio,
                usage=self._disk_usage,
            )
            if found is None:
                break
            segment, reason = found
            following = self._commitlog.segments[1].start
            self._queues.trim_below(following)
            self._index.trim_below(following)
            with self._lock:
                if self._closed or self._commitlog.segments[0] is not segment:
                    break
                self._commitlog.delete_oldest()
            deleted += 1
            log.info(
                "event=segment_deleted segment=%s reason=%s new_min_offset=%d",
                segment.path.name, reason, following,
            )  # fmt: skip
        self._retention_deleted += deleted
        return deleted

    # -- stats ---------------------------------------------------------------

    def stats(self) -> StoreStats:
        commitlog = self._commitlog
        return StoreStats(
            commit_log_min_offset=commitlog.min_offset,
            commit_log_max_offset=commitlog.write_position,
            commit_log_flushed_offset=commitlog.flushed_position,
            disk_bytes=commitlog.disk_bytes(),
            segments=len(commitlog.segments),
            queues=len(self._visible),
            extra={
                "fsyncs": self._flusher.fsyncs,
                "appends": self._appends,
                "visible_offset": self._visible_position,
                "segments_deleted": self._retention_deleted,
            },
        )
