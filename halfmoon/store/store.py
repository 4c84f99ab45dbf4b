"""MessageStore: the commit log, consume queues and key index behind the ``Store`` protocol.

Open it with ``MessageStore(StoreConfig(data_dir=...))``; close it (or use it
as a context manager) for a clean shutdown. Opening recovers (see
``recovery``).

The store owns its files and the append lock, and is made of parts that are
given what they use: the :class:`~halfmoon.store.writer.Writer` (every
append, and a replica's chunks of its master's log), the
:class:`~halfmoon.store.reader.Reader` (queue reads, records at an offset,
queries by key) and the :class:`~halfmoon.store.visibility.Visibility` (the
per-queue offset tables, the flusher, the listeners: under ``sync`` records
become visible to reads and listeners only after the flusher's fsync covers
them). What touches every part stays here: checkpoints, retention, cutting
the log back (``truncation``) and closing.

Background threads: the flusher (``flush``) and one maintenance thread that
writes a checkpoint every ``checkpoint_interval`` seconds (when something
changed) and runs retention every ``retention_check_interval`` seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from halfmoon import failpoints
from halfmoon.delegation import delegate
from halfmoon.store.api import AppendResult, EncodedRecord, StoreStats
from halfmoon.store.checkpoint import (
    Checkpoint,
    mark_clean_close,
    mark_open,
    read_checkpoint,
    write_checkpoint,
)
from halfmoon.store.commitlog import CommitLog
from halfmoon.store.config import StoreConfig
from halfmoon.store.consumequeue import ConsumeQueues
from halfmoon.store.keyindex import KeyIndex
from halfmoon.store.message import Message
from halfmoon.store.reader import Reader
from halfmoon.store.recovery import RecoveryReport, Reporter, log_reporter, recover
from halfmoon.store.retention import disk_usage_ratio, next_expired
from halfmoon.store.shipping import read_chunk
from halfmoon.store.truncation import (
    TruncationRefused,
    capped,
    clear_intent,
    read_intent,
    write_intent,
)
from halfmoon.store.visibility import Visibility
from halfmoon.store.writer import Writer, closed_error

log = logging.getLogger("halfmoon.store")


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
        # The topic-queue offset table (next queue offset to assign, per queue) starts where
        # recovery left the consume queues.
        self._visibility = Visibility(
            self._commitlog,
            self._lock,
            self._queues.max_offsets(),
            sync=config.flush == "sync",
            flush_interval=config.flush_interval,
        )
        self._writer = Writer(
            config, self._commitlog, self._queues, self._index, self._lock, self._visibility, clock
        )
        self._reader = Reader(config, self._commitlog, self._queues, self._index, self._visibility)
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
        if not self._writer.close():
            return
        self._stop.set()
        self._maintenance.join()
        self._visibility.flusher.close()
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
        visibility = self._visibility
        with self._lock:
            dispatched = self._commitlog.write_position
            queue_offsets = dict(visibility.next_offsets)
        state = (dispatched, len(queue_offsets))
        if state == self._last_checkpoint and not force:
            return
        if visibility.sync and not self._writer.closed:
            visibility.flusher.wait(dispatched)
        else:
            self._commitlog.sync(dispatched)
        self._queues.flush()
        self._index.flush()
        flushed = max(self._commitlog.flushed_position, dispatched)
        now = int(self._clock() * 1000)
        write_checkpoint(self.config.data_dir, Checkpoint(flushed, dispatched, now, queue_offsets))
        self._last_checkpoint = state

    # -- writes --------------------------------------------------------------

    # Written out rather than delegated: a producer's every message passes here, and the
    # delegating wrapper's generic call costs more than the direct one.
    def append(self, messages: Sequence[Message]) -> list[AppendResult]:
        return self._writer.append(messages)

    def append_encoded(self, records: Sequence[EncodedRecord]) -> list[AppendResult]:
        return self._writer.append_encoded(records)

    append_fanout = delegate("_writer", Writer.append_fanout)

    def put(self, messages: Sequence[Message]) -> list[AppendResult]:
        results = self._writer.append(messages)
        if results and self._visibility.sync:
            self._visibility.flusher.wait(results[-1].end_offset)
        return results

    def durable(self, end_offset: int) -> Future[None]:
        return self._visibility.flusher.durable(end_offset)

    def wait_durable(self, end_offset: int, timeout: float | None = None) -> bool:
        return self._visibility.flusher.wait(end_offset, timeout)

    add_listener = delegate("_visibility", Visibility.add_listener)
    add_batch_listener = delegate("_visibility", Visibility.add_batch_listener)
    add_write_listener = delegate("_visibility", Visibility.add_write_listener)

    # -- replication ---------------------------------------------------------

    append_replicated = delegate("_writer", Writer.append_replicated)

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
            self._visibility.flusher.close()
            with self._lock:
                if self._writer.closed:
                    raise closed_error()
                self._commitlog.truncate(offset)
                failpoints.store("truncate-after-log")
                self._queues.truncate_from(offset)
                self._index.truncate_from(offset)
                self._visibility.reset(self._queues.max_offsets(), offset)
            self._write_checkpoint_locked(force=True)
            failpoints.store("truncate-before-clear")
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
        return self._visibility.position

    # -- reads ---------------------------------------------------------------

    get = delegate("_reader", Reader.get)
    read_at = delegate("_reader", Reader.read_at)
    query_by_key = delegate("_reader", Reader.query_by_key)
    min_offset = delegate("_reader", Reader.min_offset)
    max_offset = delegate("_reader", Reader.max_offset)
    max_offset_below = delegate("_reader", Reader.max_offset_below)
    offset_for_timestamp = delegate("_reader", Reader.offset_for_timestamp)
    queues = delegate("_reader", Reader.queues)

    def delete_topic(self, topic: str) -> None:
        with self._lock:
            self._queues.delete_topic(topic)
            self._visibility.forget_topic(topic)
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
                if self._writer.closed or self._commitlog.segments[0] is not segment:
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
        commitlog, visibility = self._commitlog, self._visibility
        return StoreStats(
            commit_log_min_offset=commitlog.min_offset,
            commit_log_max_offset=commitlog.write_position,
            commit_log_flushed_offset=commitlog.flushed_position,
            disk_bytes=commitlog.disk_bytes(),
            segments=len(commitlog.segments),
            queues=len(visibility.visible),
            extra={
                "fsyncs": visibility.flusher.fsyncs,
                "appends": self._writer.appends,
                "visible_offset": visibility.position,
                "segments_deleted": self._retention_deleted,
            },
        )
