"""Consume queues: per (topic, queue id), a dense array of 20-byte entries.

Layout: ``<root>/<topic>/<queue_id>/<20-digit first queue offset>``. Each file
holds ``capacity`` entries (``entries_per_file`` when created; an existing
file keeps the capacity its length gives it). An entry is big-endian
``commit_log_offset i64, size i32, tag_hash i64``. A file is created at full
length (sparse), so an all-zero entry means "not written yet": the queue ends
at the first zero entry of its last file. Records are never empty, so a real
entry is never all zero.

Minimum offset: retention (``trim_below``) deletes files wholly below the cut
and overwrites the ``size`` of trimmed entries left in the first file with
``TRIMMED_SIZE`` (-1), keeping their commit-log offset. On open the minimum is
the first entry that is not trimmed, so it survives restarts without a
sidecar file. The newest file is never deleted, so an empty queue still
remembers its maximum offset.

Repair on open (each repair logs a warning on ``halfmoon.store``): names that
are not 20 digits are ignored; a length that is not a multiple of 20 is cut
down; the queue ends at the first zero entry or at a torn/out-of-order entry
near the end; anything after that point is cut (so stale bytes can never come
back); a file that is not full while a later file exists is a hole, and the
later files are deleted. The queue is rebuildable from the commit log: the
facade sees the shortfall (``QueueGapError`` on re-dispatch, or a max offset
below its checkpoint) and rebuilds.

Entries carry no checksum (the format is fixed): a byte flipped in the middle
of a file is not detected here. The facade checks that the record it reads
carries the expected commit-log offset and queue offset.

Memory: nothing grows with the number of messages except the per-queue list
of files. At most ``max_open_files`` files are mapped at once (CLOCK
eviction), because every mapping holds a file descriptor.

Thread safety: every public method takes one lock.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import shutil
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from halfmoon.errors import InvalidArgument, StorageError
from halfmoon.store.fsutil import fsync_directory, fsync_file, make_directory

log = logging.getLogger("halfmoon.store")

ENTRY = struct.Struct(">qiq")  # commit_log_offset, size, tag_hash
ENTRY_SIZE = ENTRY.size  # 20
TRIMMED_SIZE = -1  # the size field of an entry retention has removed
_ZERO_ENTRY = bytes(ENTRY_SIZE)
_SIZE_AT = 8  # byte position of the size field inside an entry
_FILE_NAME = re.compile(r"^\d{20}$")
_QUEUE_DIR_NAME = re.compile(r"^(0|[1-9]\d{0,9})$")  # exactly str(queue_id)
# Torn writes happen at page granularity, so the last few pages' worth of
# entries are checked one by one on open (the rest relies on the zero scan).
_TAIL_CHECK_ENTRIES = 1024
# Only files written since the last flush can hide an unwritten page; with
# lazy flushing that is the newest file or two of a queue. Older files get
# the tail check only, so opening does not read every queue from disk.
_FULLY_SCANNED_FILES = 2


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


@dataclass(frozen=True, slots=True)
class QueueEntry:
    queue_offset: int
    commit_log_offset: int
    size: int
    tag_hash: int


_set_queue_offset = QueueEntry.queue_offset.__set__  # type: ignore[attr-defined]
_set_commit_log_offset = QueueEntry.commit_log_offset.__set__  # type: ignore[attr-defined]
_set_size = QueueEntry.size.__set__  # type: ignore[attr-defined]
_set_tag_hash = QueueEntry.tag_hash.__set__  # type: ignore[attr-defined]


def _make_entry(queue_offset: int, commit_log_offset: int, size: int, tag_hash: int) -> QueueEntry:
    """A QueueEntry at almost half the cost of the frozen dataclass's ``__init__``.

    The generated ``__init__`` goes through ``object.__setattr__`` per field;
    the slot descriptors are set directly instead (reads are the hot path).
    """
    entry = object.__new__(QueueEntry)
    _set_queue_offset(entry, queue_offset)
    _set_commit_log_offset(entry, commit_log_offset)
    _set_size(entry, size)
    _set_tag_hash(entry, tag_hash)
    return entry


class _QueueFile:
    """One file of a queue; ``mm`` is set while it is mapped."""

    __slots__ = ("path", "start", "capacity", "mm", "referenced", "dirty")

    def __init__(self, path: Path, start: int, capacity: int) -> None:
        self.path = path
        self.start = start
        self.capacity = capacity
        self.mm: mmap.mmap | None = None
        self.referenced = False
        self.dirty = False

    @property
    def end(self) -> int:
        return self.start + self.capacity


class _Queue:
    __slots__ = ("topic", "queue_id", "directory", "files", "min_offset", "max_offset")

    def __init__(self, topic: str, queue_id: int, directory: Path) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.directory = directory
        self.files: list[_QueueFile] = []
        self.min_offset = 0
        self.max_offset = 0

    def file_for(self, queue_offset: int) -> _QueueFile | None:
        """The file holding ``queue_offset`` (files are few: scan from the newest)."""
        for f in reversed(self.files):
            if f.start <= queue_offset:
                return f if queue_offset < f.end else None
        return None


class _MapCache:
    """At most ``limit`` files mapped at once; CLOCK (second chance) eviction.

    A hit costs one attribute store (``referenced = True``); only misses touch
    the ring. Evicting a dirty file msyncs it first, so ``flush`` never needs
    to reopen a file.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._ring: dict[_QueueFile, None] = {}

    def get(self, f: _QueueFile) -> mmap.mmap:
        mm = f.mm
        if mm is not None:
            f.referenced = True
            return mm
        while len(self._ring) >= self.limit:
            victim = next(iter(self._ring))
            del self._ring[victim]
            if victim.referenced:
                victim.referenced = False
                self._ring[victim] = None
            else:
                self._unmap(victim, sync=True)
        fd = os.open(f.path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, f.capacity * ENTRY_SIZE)
        finally:
            os.close(fd)  # the mapping keeps its own descriptor
        f.mm = mm
        f.referenced = False
        self._ring[f] = None
        return mm

    def drop(self, f: _QueueFile, *, sync: bool) -> None:
        if f.mm is not None:
            self._ring.pop(f, None)
            self._unmap(f, sync=sync)

    @staticmethod
    def _unmap(f: _QueueFile, *, sync: bool) -> None:
        mm = f.mm
        if mm is None:
            return
        if sync and f.dirty:
            mm.flush()
            f.dirty = False
        mm.close()
        f.mm = None

    def open_count(self) -> int:
        return len(self._ring)


def _check_topic(topic: str) -> None:
    if not topic or topic in (".", "..") or "/" in topic or "\\" in topic or "\0" in topic:
        raise InvalidArgument(
            f"topic name {topic!r} cannot name a consume-queue directory; "
            "use letters, digits, '-', '_', '%' or '|'"
        )


def _first_zero_entry(buf: mmap.mmap | bytes, count: int) -> int:
    """Index of the first all-zero entry among ``count``, or ``count`` if none.

    A 20-byte zero run inside real entries is practically impossible (the size
    field is never zero), so one C-speed ``find`` usually answers; the loop
    only guards against the odd unaligned run.
    """
    limit = count * ENTRY_SIZE
    pos = buf.find(_ZERO_ENTRY, 0, limit)
    while pos != -1:
        index = -(-pos // ENTRY_SIZE)
        at = index * ENTRY_SIZE
        if at + ENTRY_SIZE > limit:
            return count
        if buf[at : at + ENTRY_SIZE] == _ZERO_ENTRY:
            return index
        pos = buf.find(_ZERO_ENTRY, pos + 1, limit)
    return count


def _valid_prefix_end(buf: mmap.mmap, end: int) -> int:
    """Cut torn or out-of-order entries from the last ``_TAIL_CHECK_ENTRIES`` before ``end``."""
    first = max(0, end - _TAIL_CHECK_ENTRIES)
    previous = -1
    if first > 0:
        previous = ENTRY.unpack_from(buf, (first - 1) * ENTRY_SIZE)[0]
    index = first
    for offset, size, _tag in ENTRY.iter_unpack(buf[first * ENTRY_SIZE : end * ENTRY_SIZE]):
        if offset < 0 or offset <= previous or (size <= 0 and size != TRIMMED_SIZE):
            return index
        previous = offset
        index += 1
    return end


class ConsumeQueues:
    """Every consume queue under ``root``; see the module docstring for the format."""

    def __init__(
        self, root: Path, entries_per_file: int = 300_000, *, max_open_files: int = 512
    ) -> None:
        if entries_per_file < 1:
            raise InvalidArgument("entries_per_file must be at least 1")
        self.root = Path(root)
        self.entries_per_file = entries_per_file
        self._maps = _MapCache(max_open_files)
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._dirty: list[_QueueFile] = []
        self._lock = threading.Lock()
        self._closed = False
        self._load()

    # -- opening -------------------------------------------------------------

    def _load(self) -> None:
        if not self.root.is_dir():
            return
        for topic_dir in sorted(self.root.iterdir()):
            if not topic_dir.is_dir():
                log.warning("consume queue: ignoring stray file %s", topic_dir)
                continue
            for queue_dir in sorted(topic_dir.iterdir()):
                if not (queue_dir.is_dir() and _QUEUE_DIR_NAME.match(queue_dir.name)):
                    log.warning("consume queue: ignoring unexpected entry %s", queue_dir)
                    continue
                queue = _Queue(topic_dir.name, int(queue_dir.name), queue_dir)
                try:
                    self._load_queue(queue)
                except OSError as exc:
                    log.warning("consume queue %s unreadable, ignored: %s", queue_dir, exc)
                    continue
                if queue.files:
                    self._queues[(queue.topic, queue.queue_id)] = queue

    def _load_queue(self, queue: _Queue) -> None:
        names = []
        for path in queue.directory.iterdir():
            if path.is_file() and _FILE_NAME.match(path.name):
                names.append((int(path.name), path))
            else:
                log.warning("consume queue: ignoring unexpected file %s", path)
        names.sort()
        for position, (start, path) in enumerate(names):
            previous = queue.files[-1] if queue.files else None
            if previous is not None and (queue.max_offset != previous.end or start != previous.end):
                log.warning(
                    "consume queue %s/%s: hole before offset %d (queue ends at %d); "
                    "deleting %d later file(s)",
                    queue.topic,
                    queue.queue_id,
                    start,
                    queue.max_offset,
                    len(names) - position,
                )
                for _, later in names[position:]:
                    later.unlink()
                fsync_directory(queue.directory)
                break
            recent = position >= len(names) - _FULLY_SCANNED_FILES
            f, valid = self._open_file(queue, path, start, scan_all=recent)
            queue.files.append(f)
            queue.max_offset = start + valid
        if not queue.files:
            return
        self._repair_tail(queue)
        self._find_min_offset(queue)

    def _open_file(
        self, queue: _Queue, path: Path, start: int, *, scan_all: bool
    ) -> tuple[_QueueFile, int]:
        length = path.stat().st_size
        if length % ENTRY_SIZE:
            log.warning(
                "consume queue file %s: length %d is not a multiple of %d; cutting the torn entry",
                path,
                length,
                ENTRY_SIZE,
            )
            length -= length % ENTRY_SIZE
            os.truncate(path, length)
        f = _QueueFile(path, start, length // ENTRY_SIZE)
        if f.capacity == 0:
            return f, 0
        mm = self._maps.get(f)
        if scan_all:
            zero_at = _first_zero_entry(mm, f.capacity)
        else:  # only the tail: reading every old file would read the whole queue
            tail_from = max(0, f.capacity - _TAIL_CHECK_ENTRIES)
            zero_at = tail_from + _first_zero_entry(mm[tail_from * ENTRY_SIZE :], f.capacity - tail_from)  # fmt: skip
        valid = _valid_prefix_end(mm, zero_at)
        if valid < zero_at:
            log.warning(
                "consume queue file %s: torn or out-of-order entry at offset %d; cut there",
                path,
                start + valid,
            )
        return f, valid

    def _repair_tail(self, queue: _Queue) -> None:
        """Cut everything after the last valid entry; give the last file room to grow."""
        tail = queue.files[-1]
        used = queue.max_offset - tail.start
        capacity = max(tail.capacity, self.entries_per_file)
        if used < tail.capacity:
            # Truncate then extend: the bytes after the end become a hole (zeros),
            # so stale entries past a torn point can never be mistaken for data.
            self._maps.drop(tail, sync=False)
            os.truncate(tail.path, used * ENTRY_SIZE)
            os.truncate(tail.path, capacity * ENTRY_SIZE)
        elif capacity != tail.capacity:
            self._maps.drop(tail, sync=False)
            os.truncate(tail.path, capacity * ENTRY_SIZE)
        tail.capacity = capacity

    def _find_min_offset(self, queue: _Queue) -> None:
        """The first entry that retention has not marked; drop files wholly marked."""
        while True:
            first = queue.files[0]
            used = min(queue.max_offset, first.end) - first.start
            if used <= 0:  # only a lone, empty file
                queue.min_offset = queue.max_offset
                return
            mm = self._maps.get(first)
            lo, hi = 0, used
            while lo < hi:  # marked entries form a prefix
                mid = (lo + hi) // 2
                if ENTRY.unpack_from(mm, mid * ENTRY_SIZE)[1] == TRIMMED_SIZE:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < used or len(queue.files) == 1:
                queue.min_offset = first.start + lo
                return
            # Retention was interrupted after marking but before deleting.
            log.warning("consume queue file %s is wholly trimmed; deleting it", first.path)
            self._forget_file(queue.files.pop(0))
            fsync_directory(queue.directory)

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
        queue: _Queue | None,
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

    def _mark_dirty(self, f: _QueueFile) -> None:
        if not f.dirty:
            f.dirty = True
            self._dirty.append(f)

    def _create_queue(self, topic: str, queue_id: int, start: int) -> _Queue:
        _check_topic(topic)
        if queue_id < 0:
            raise InvalidArgument(f"queue id must be >= 0, got {queue_id}")
        queue = _Queue(topic, queue_id, self.root / topic / str(queue_id))
        make_directory(queue.directory)
        queue.min_offset = queue.max_offset = start
        self._add_file(queue, start)
        self._queues[(topic, queue_id)] = queue
        return queue

    def _add_file(self, queue: _Queue, start: int) -> None:
        path = queue.directory / f"{start:020d}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, self.entries_per_file * ENTRY_SIZE)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_directory(queue.directory)
        queue.files.append(_QueueFile(path, start, self.entries_per_file))

    def _truncate_queue(self, queue: _Queue, cut: int) -> None:
        """Drop entries at queue offsets >= ``cut`` (``min_offset <= cut <= max_offset``)."""
        if cut >= queue.max_offset:
            return
        removed = False
        while len(queue.files) > 1 and queue.files[-1].start >= cut:
            f = queue.files.pop()
            self._forget_file(f)
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

    def _forget_file(self, f: _QueueFile) -> None:
        self._maps.drop(f, sync=False)
        f.dirty = False
        f.path.unlink(missing_ok=True)

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

    def _trim_queue(self, queue: _Queue, new_min: int) -> None:
        # Delete first (oldest files), then mark: a crash in between leaves
        # unmarked entries that are merely still served, never a wrong min.
        removed = False
        while len(queue.files) > 1 and queue.files[0].end <= new_min:
            self._forget_file(queue.files.pop(0))
            removed = True
        if removed:
            fsync_directory(queue.directory)
        f = queue.files[0]
        first = max(queue.min_offset, f.start) - f.start
        last = min(new_min, f.end) - f.start
        if last > first:
            mm = self._maps.get(f)
            marker = ENTRY.pack(0, TRIMMED_SIZE, 0)[_SIZE_AT : _SIZE_AT + 4]
            count = last - first
            base = first * ENTRY_SIZE + _SIZE_AT
            stop = last * ENTRY_SIZE
            for i in range(4):  # one strided slice assignment per byte of the size field
                mm[base + i : stop : ENTRY_SIZE] = marker[i : i + 1] * count
            self._mark_dirty(f)
        queue.min_offset = new_min

    def _first_at_or_after(self, queue: _Queue, commit_log_offset: int) -> int:
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

    def _offset_at(self, queue: _Queue, queue_offset: int) -> int:
        f = queue.file_for(queue_offset)
        assert f is not None
        mm = self._maps.get(f)
        return ENTRY.unpack_from(mm, (queue_offset - f.start) * ENTRY_SIZE)[0]

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

    def _remove_queue_files(self, queue: _Queue) -> None:
        for f in queue.files:
            self._forget_file(f)
        queue.files.clear()

    # -- reading -------------------------------------------------------------

    def entries(self, topic: str, queue_id: int, start: int, max_count: int) -> list[QueueEntry]:
        """Up to ``max_count`` entries from ``max(start, min_offset)``; [] if none."""
        first, raw = self.raw_entries(topic, queue_id, start, max_count)
        return [_make_entry(i, clo, size, tag) for i, (clo, size, tag) in enumerate(raw, first)]

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
