"""Opening the consume queues: read every queue's files and repair what a crash left.

Each repair logs a warning on ``halfmoon.store``: names that are not 20
digits are ignored; a length that is not a multiple of 20 is cut down; the
queue ends at the first zero entry or at a torn/out-of-order entry near the
end; anything after that point is cut (so stale bytes can never come back);
a file that is not full while a later file exists is a hole, and the later
files are deleted. The queue is rebuildable from the commit log: the store
sees the shortfall (``QueueGapError`` on re-dispatch, or a max offset below
its checkpoint) and rebuilds.

The minimum offset is the first entry retention has not marked trimmed, so
it survives restarts without a sidecar file; a file wholly marked (retention
interrupted between marking and deleting) is deleted here.

Entries carry no checksum: a byte flipped in the middle of a file is not
detected here. The store checks that the record it reads carries the
expected commit-log offset and queue offset.
"""

from __future__ import annotations

import logging
import mmap
import os
from pathlib import Path

from halfmoon.store.fsutil import fsync_directory
from halfmoon.store.queuefiles import MapCache, Queue, QueueFile
from halfmoon.store.queueformat import (
    ENTRY,
    ENTRY_SIZE,
    FILE_NAME,
    QUEUE_DIR_NAME,
    TRIMMED_SIZE,
    ZERO_ENTRY,
)

log = logging.getLogger("halfmoon.store")

# Torn writes happen at page granularity, so the last few pages' worth of
# entries are checked one by one on open (the rest relies on the zero scan).
_TAIL_CHECK_ENTRIES = 1024
# Only files written since the last flush can hide an unwritten page; with
# lazy flushing that is the newest file or two of a queue. Older files get
# the tail check only, so opening does not read every queue from disk.
_FULLY_SCANNED_FILES = 2


def load_queues(root: Path, entries_per_file: int, maps: MapCache) -> dict[tuple[str, int], Queue]:
    """Every queue with at least one file under ``root``, repaired; keyed by (topic, queue id)."""
    queues: dict[tuple[str, int], Queue] = {}
    if not root.is_dir():
        return queues
    for topic_dir in sorted(root.iterdir()):
        if not topic_dir.is_dir():
            log.warning("consume queue: ignoring stray file %s", topic_dir)
            continue
        for queue_dir in sorted(topic_dir.iterdir()):
            if not (queue_dir.is_dir() and QUEUE_DIR_NAME.match(queue_dir.name)):
                log.warning("consume queue: ignoring unexpected entry %s", queue_dir)
                continue
            queue = Queue(topic_dir.name, int(queue_dir.name), queue_dir)
            try:
                _load_queue(queue, entries_per_file, maps)
            except OSError as exc:
                log.warning("consume queue %s unreadable, ignored: %s", queue_dir, exc)
                continue
            if queue.files:
                queues[(queue.topic, queue.queue_id)] = queue
    return queues


def _load_queue(queue: Queue, entries_per_file: int, maps: MapCache) -> None:
    names: list[tuple[int, Path]] = []
    for path in queue.directory.iterdir():
        if path.is_file() and FILE_NAME.match(path.name):
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
        f, valid = _open_file(path, start, maps, scan_all=recent)
        queue.files.append(f)
        queue.max_offset = start + valid
    if not queue.files:
        return
    _repair_tail(queue, entries_per_file, maps)
    _find_min_offset(queue, maps)


def _open_file(path: Path, start: int, maps: MapCache, *, scan_all: bool) -> tuple[QueueFile, int]:
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
    f = QueueFile(path, start, length // ENTRY_SIZE)
    if f.capacity == 0:
        return f, 0
    mm = maps.get(f)
    if scan_all:
        zero_at = _first_zero_entry(mm, f.capacity)
    else:  # only the tail: reading every old file would read the whole queue
        tail_from = max(0, f.capacity - _TAIL_CHECK_ENTRIES)
        tail = mm[tail_from * ENTRY_SIZE :]
        zero_at = tail_from + _first_zero_entry(tail, f.capacity - tail_from)
    valid = _valid_prefix_end(mm, zero_at)
    if valid < zero_at:
        log.warning(
            "consume queue file %s: torn or out-of-order entry at offset %d; cut there",
            path,
            start + valid,
        )
    return f, valid


def _repair_tail(queue: Queue, entries_per_file: int, maps: MapCache) -> None:
    """Cut everything after the last valid entry; give the last file room to grow."""
    tail = queue.files[-1]
    used = queue.max_offset - tail.start
    capacity = max(tail.capacity, entries_per_file)
    if used < tail.capacity:
        # Truncate then extend: the bytes after the end become a hole (zeros),
        # so stale entries past a torn point can never be mistaken for data.
        maps.drop(tail, sync=False)
        os.truncate(tail.path, used * ENTRY_SIZE)
        os.truncate(tail.path, capacity * ENTRY_SIZE)
    elif capacity != tail.capacity:
        maps.drop(tail, sync=False)
        os.truncate(tail.path, capacity * ENTRY_SIZE)
    tail.capacity = capacity


def _find_min_offset(queue: Queue, maps: MapCache) -> None:
    """The first entry that retention has not marked; drop files wholly marked."""
    while True:
        first = queue.files[0]
        used = min(queue.max_offset, first.end) - first.start
        if used <= 0:  # only a lone, empty file
            queue.min_offset = queue.max_offset
            return
        mm = maps.get(first)
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
        maps.forget(queue.files.pop(0))
        fsync_directory(queue.directory)


def _first_zero_entry(buf: mmap.mmap | bytes, count: int) -> int:
    """Index of the first all-zero entry among ``count``, or ``count`` if none.

    A 20-byte zero run inside real entries is practically impossible (the size
    field is never zero), so one C-speed ``find`` usually answers; the loop
    only guards against the odd unaligned run.
    """
    limit = count * ENTRY_SIZE
    pos = buf.find(ZERO_ENTRY, 0, limit)
    while pos != -1:
        index = -(-pos // ENTRY_SIZE)
        at = index * ENTRY_SIZE
        if at + ENTRY_SIZE > limit:
            return count
        if buf[at : at + ENTRY_SIZE] == ZERO_ENTRY:
            return index
        pos = buf.find(ZERO_ENTRY, pos + 1, limit)
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
