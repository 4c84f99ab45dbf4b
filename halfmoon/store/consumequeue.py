"""Consume queues: per (topic, queue id), a dense array of 20-byte entries.

The file format is in ``queueformat`` (and ``docs/storage-format.md``); a
queue's files and the cache of their mappings in ``queuefiles``; opening and
repairing what a crash left in ``queuerepair``. This module writes, reads,
trims and flushes them.

The queue ends at the first zero entry of its last file. Minimum offset:
retention (``trim_below``) deletes files wholly below the cut and overwrites
the ``size`` of trimmed entries left in the first file with ``TRIMMED_SIZE``
(-1), keeping their commit-log offset; on open the minimum is the first entry
that is not trimmed. The newest file is never deleted, so an empty queue
still remembers its maximum offset.

Thread safety: every public method takes one lock.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from halfmoon.errors import InvalidArgument, StorageError
from halfmoon.store.fsutil import fsync_directory, fsync_file, make_directory
from halfmoon.store.queuefiles import MapCache, Queue, QueueFile
from halfmoon.store.queueformat import (
    ENTRY,
    ENTRY_SIZE,
    SIZE_AT,
    TRIMMED_MARKER,
    TRIMMED_SIZE,
    QueueEntry,
    file_name,
    make_entry,
)
from halfmoon.store.queuerepair import load_queues

__all__ = [
    "ENTRY",
    "ENTRY_SIZE",
    "TRIMMED_SIZE",
    "ConsumeQueues",
    "QueueEntry",
    "QueueGapError",
]

log = logging.getLogger("halfmoon.store")


class QueueGapError(StorageError):
    """A consume-queue entry was put past the queue's end: the queue lost entries."""

    code = "STORAGE_QUEUE_GAP"
    protocol_code = "INTERNAL_ERROR"

    def __init__(self, topic: str, queue_id: int, expected: int, got: int) -> None:
        super().__init__(
            f"consume queue {topic}/{queue_id} ends at offset {expected} but an entry for "
            f"offset {got} arrived; the queue is missing entries and must be rebuilt "
            "from the commit log"
        )
        self.topic = topic
        self.queue_id = queue_id
        self.expected = expected
        self.got = got


def _check_topic(topic: str) -> None:
    if not topic or topic in (".", "..") or "/" in topic or "\\" in topic or "\0" in topic:
        raise InvalidArgument(
            f"topic name {topic!r} cannot name a consume-queue directory; "
            "use letters, digits, '-', '_', '%' or '|'"
        )


class ConsumeQueues:
    """Every consume queue under ``root``; see the module docstring for the format."""

    def __init__(
        self, root: Path, entries_per_file: int = 300_000, *, max_open_files: int = 512
    ) -> None:
        if entries_per_file < 1:
            raise InvalidArgument("entries_per_file must be at least 1")
        self.root = Path(root)
        self.entries_per_file = entries_per_file
        self._maps = MapCache(max_open_files)
        self._dirty: list[QueueFile] = []
        self._lock = threading.Lock()
        self._closed = False
        self._queues: dict[tuple[str, int], Queue] = load_queues(
            self.root, entries_per_file, self._maps
        )

    # -- writing -------------------------------------------------------------

    def put(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        commit_log_offset: int,
        size: int,
        tag_hash: int,
    ) -> None:
        with self._lock:
            queue = self._queues.get((topic, queue_id))
            if queue is not None and queue_offset == queue.max_offset and size > 0:
                f = queue.files[-1]
                index = queue_offset - f.start
                if index < f.capacity:  # the hot path: append into the mapped tail
                    mm = f.mm if f.mm is not None else self._maps.get(f)
                    f.referenced = True
                    ENTRY.pack_into(mm, index * ENTRY_SIZE, commit_log_offset, size, tag_hash)
                    queue.max_offset = queue_offset + 1
                    if not f.dirty:
                        f.dirty = True
                        self._dirty.append(f)
                    return
            self._put_slow(topic, queue_id, queue, queue_offset, commit_log_offset, size, tag_hash)

    def _put_slow(
        self,
        topic: str,
        queue_id: int,
        queue: Queue | None,
        queue_offset: int,
        commit_log_offset: int,
        size: int,
        tag_hash: int,
    ) -> None:
        if size <= 0 or commit_log_offset < 0 or queue_offset < 0:
            raise InvalidArgument(
                f"consume-queue entry needs size > 0 and non-negative offsets, got "
                f"queue offset {queue_offset}, commit-log offset {commit_log_offset}, size {size}"
            )
        if queue is None:
            # A queue with no files accepts any first offset: a rebuild after
            # retention starts wherever the oldest retained message is.
            queue = self._create_queue(topic, queue_id, queue_offset)
        if queue_offset > queue.max_offset:
            raise QueueGapError(topic, queue_id, queue.max_offset, queue_offset)
        if queue_offset < queue.min_offset:
            log.warning(
                "consume queue %s/%s: ignoring entry for trimmed offset %d (min offset %d)",
                topic,
                queue_id,
                queue_offset,
                queue.min_offset,
            )
            return
        if queue_offset < queue.max_offset:
            f = queue.file_for(queue_offset)
            assert f is not None
            mm = self._maps.get(f)
            existing = ENTRY.unpack_from(mm, (queue_offset - f.start) * ENTRY_SIZE)[0]
            if existing == commit_log_offset:
                return  # re-dispatch of an entry already there
            self._truncate_queue(queue, queue_offset)
        if queue_offset == queue.files[-1].end:
            self._add_file(queue, queue_offset)
        f = queue.files[-1]
        mm = self._maps.get(f)
        ENTRY.pack_into(
            mm, (queue_offset - f.start) * ENTRY_SIZE, commit_log_offset, size, tag_hash
        )
        queue.max_offset = queue_offset + 1
        self._mark_dirty(f)

    def _mark_dirty(self, f: QueueFile) -> None:
        if not f.dirty:
            f.dirty = True
            self._dirty.append(f)

    def _create_queue(self, topic: str, queue_id: int, start: int) -> Queue:
        _check_topic(topic)
        if queue_id < 0:
            raise InvalidArgument(f"queue id must be >= 0, got {queue_id}")
        queue = Queue(topic, queue_id, self.root / topic / str(queue_id))
        make_directory(queue.directory)
        queue.min_offset = queue.max_offset = start
        self._add_file(queue, start)
        self._queues[(topic, queue_id)] = queue
        return queue

    def _add_file(self, queue: Queue, start: int) -> None:
        path = queue.directory / file_name(start)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, self.entries_per_file * ENTRY_SIZE)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_directory(queue.directory)
        queue.files.append(QueueFile(path, start, self.entries_per_file))

    def _truncate_queue(self, queue: Queue, cut: int) -> None:
        """Drop entries at queue offsets >= ``cut`` (``min_offset <= cut <= max_offset``)."""
        if cut >= queue.max_offset:
            return
        removed = False
        while len(queue.files) > 1 and queue.files[-1].start >= cut:
            f = queue.files.pop()
            self._maps.forget(f)
            removed = True
        if removed:
            fsync_directory(queue.directory)
        f = queue.files[-1]
        stop = min(queue.max_offset, f.end)
        if cut < stop:
            mm = self._maps.get(f)
            a, b = (cut - f.start) * ENTRY_SIZE, (stop - f.start) * ENTRY_SIZE
            mm[a:b] = bytes(b - a)
            self._mark_dirty(f)
        queue.max_offset = cut
        queue.min_offset = min(queue.min_offset, cut)

    def truncate_from(self, commit_log_offset: int) -> None:
        with self._lock:
            for queue in self._queues.values():
                cut = self._first_at_or_after(queue, commit_log_offset)
                if cut < queue.max_offset:
                    self._truncate_queue(queue, cut)

    def trim_below(self, commit_log_offset: int) -> None:
        with self._lock:
            for queue in self._queues.values():
                new_min = self._first_at_or_after(queue, commit_log_offset)
                if new_min > queue.min_offset:
                    self._trim_queue(queue, new_min)

    def _trim_queue(self, queue: Queue, new_min: int) -> None:
        # Delete first (oldest files), then mark: a crash in between leaves
        # unmarked entries that are merely still served, never a wrong min.
        removed = False
        while len(queue.files) > 1 and queue.files[0].end <= new_min:
            self._maps.forget(queue.files.pop(0))
            removed = True
        if removed:
            fsync_directory(queue.directory)
        f = queue.files[0]
        first = max(queue.min_offset, f.start) - f.start
        last = min(new_min, f.end) - f.start
        if last > first:
            mm = self._maps.get(f)
            marker = TRIMMED_MARKER
            count = last - first
            base = first * ENTRY_SIZE + SIZE_AT
            stop = last * ENTRY_SIZE
            for i in range(4):  # one strided slice assignment per byte of the size field
                mm[base + i : stop : ENTRY_SIZE] = marker[i : i + 1] * count
            self._mark_dirty(f)
        queue.min_offset = new_min

    def _first_at_or_after(self, queue: Queue, commit_log_offset: int) -> int:
        """First queue offset in [min, max) whose entry starts at/after ``commit_log_offset``."""
        lo, hi = queue.min_offset, queue.max_offset
        if lo >= hi or self._offset_at(queue, hi - 1) < commit_log_offset:
            return hi
        while lo < hi:
            mid = (lo + hi) // 2
            if self._offset_at(queue, mid) < commit_log_offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _offset_at(self, queue: Queue, queue_offset: int) -> int:
        f = queue.file_for(queue_offset)
        assert f is not None
        mm = self._maps.get(f)
        offset: int = ENTRY.unpack_from(mm, (queue_offset - f.start) * ENTRY_SIZE)[0]
        return offset

    def reset_queue(self, topic: str, queue_id: int) -> None:
        with self._lock:
            queue = self._queues.pop((topic, queue_id), None)
            if queue is not None:
                self._remove_queue_files(queue)
            directory = self.root / topic / str(queue_id)
            if directory.is_dir():
                shutil.rmtree(directory)
                fsync_directory(directory.parent)

    def delete_topic(self, topic: str) -> None:
        with self._lock:
            for key in [k for k in self._queues if k[0] == topic]:
                self._remove_queue_files(self._queues.pop(key))
            directory = self.root / topic
            if topic not in ("", ".", "..") and "/" not in topic and directory.is_dir():
                shutil.rmtree(directory)
                fsync_directory(self.root)

    def _remove_queue_files(self, queue: Queue) -> None:
        for f in queue.files:
            self._maps.forget(f)
        queue.files.clear()

    # -- reading -------------------------------------------------------------

    def entries(self, topic: str, queue_id: int, start: int, max_count: int) -> list[QueueEntry]:
        """Up to ``max_count`` entries from ``max(start, min_offset)``; [] if none."""
        first, raw = self.raw_entries(topic, queue_id, start, max_count)
        return [make_entry(i, clo, size, tag) for i, (clo, size, tag) in enumerate(raw, first)]

    def raw_entries(
        self, topic: str, queue_id: int, start: int, max_count: int
    ) -> tuple[int, list[tuple[int, int, int]]]:
        """Like ``entries`` without the objects: (first queue offset, [(clo, size, tag hash)]).

        For the read path's tag filter: a tuple costs a fraction of a QueueEntry.
        """
        with self._lock:
            queue = self._queues.get((topic, queue_id))
            if queue is None or max_count <= 0:
                return start, []
            offset = first = max(start, queue.min_offset)
            stop = min(queue.max_offset, offset + max_count)
            result: list[tuple[int, int, int]] = []
            while offset < stop:
                f = queue.file_for(offset)
                if f is None:
                    break
                mm = f.mm if f.mm is not None else self._maps.get(f)
                f.referenced = True
                chunk_stop = min(stop, f.end)
                raw = mm[(offset - f.start) * ENTRY_SIZE : (chunk_stop - f.start) * ENTRY_SIZE]
                result.extend(ENTRY.iter_unpack(raw))
                offset = chunk_stop
            return first, result

    def min_offset(self, topic: str, queue_id: int) -> int:
        queue = self._queues.get((topic, queue_id))
        return queue.min_offset if queue is not None else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        queue = self._queues.get((topic, queue_id))
        return queue.max_offset if queue is not None else 0

    def last_entry(self, topic: str, queue_id: int) -> QueueEntry | None:
        queue = self._queues.get((topic, queue_id))
        if queue is None or queue.max_offset <= queue.min_offset:
            return None
        found = self.entries(topic, queue_id, queue.max_offset - 1, 1)
        return found[0] if found else None

    def queues(self) -> list[tuple[str, int]]:
        with self._lock:
            return sorted(self._queues)

    def max_offsets(self) -> dict[tuple[str, int], int]:
        with self._lock:
            return {key: q.max_offset for key, q in self._queues.items()}

    def lookup_by_time(
        self,
        topic: str,
        queue_id: int,
        timestamp: int,
        store_timestamp_of: Callable[[int], int],
    ) -> int:
        """First queue offset whose message was stored at/after ``timestamp``, else max_offset."""
        with self._lock:
            queue = self._queues.get((topic, queue_id))
            if queue is None:
                return 0
            lo, hi = queue.min_offset, queue.max_offset
        while lo < hi:  # the callback reads the commit log: keep it outside the lock
            mid = (lo + hi) // 2
            found = self.entries(topic, queue_id, mid, 1)
            if not found or found[0].queue_offset != mid:
                lo = mid + 1  # trimmed meanwhile: treat as older
                continue
            if store_timestamp_of(found[0].commit_log_offset) < timestamp:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # -- durability ----------------------------------------------------------

    def flush(self) -> None:
        """Make every file written since the last flush durable.

        ``mmap.flush`` holds the GIL for the whole msync, stalling every other
        thread (a once-per-checkpoint latency spike for the server); an fsync of
        the same file through its own descriptor writes the same dirty pages
        with the GIL released, and outside this object's lock.
        """
        with self._lock:
            dirty, self._dirty = self._dirty, []
            paths = [f.path for f in dirty if f.dirty and f.mm is not None]
            for f in dirty:
                f.dirty = False
        for path in paths:
            fsync_file(path)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            for f in self._dirty:
                if f.dirty and f.mm is not None:
                    f.mm.flush()
                f.dirty = False
            self._dirty = []
            for queue in self._queues.values():
                for f in queue.files:
                    self._maps.drop(f, sync=False)
            self._queues.clear()
            self._closed = True

    def open_file_count(self) -> int:
        """How many queue files are mapped right now (bounded by ``max_open_files``)."""
        return self._maps.open_count()
