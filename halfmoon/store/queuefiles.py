"""A consume queue's files in memory, and the cache that bounds how many are mapped.

``Queue`` is the ordered list of one queue's files with its minimum and
maximum offsets; ``QueueFile`` is one file and, while it is mapped, its
mapping. Nothing here reads or repairs entries (``queuerepair`` does that on
open, ``consumequeue`` afterwards).

Memory: nothing grows with the number of messages except the per-queue list
of files. At most ``limit`` files are mapped at once (CLOCK eviction),
because every mapping holds a file descriptor.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from halfmoon.store.queueformat import ENTRY_SIZE


class QueueFile:
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


class Queue:
    __slots__ = ("topic", "queue_id", "directory", "files", "min_offset", "max_offset")

    def __init__(self, topic: str, queue_id: int, directory: Path) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.directory = directory
        self.files: list[QueueFile] = []
        self.min_offset = 0
        self.max_offset = 0

    def file_for(self, queue_offset: int) -> QueueFile | None:
        """The file holding ``queue_offset`` (files are few: scan from the newest)."""
        for f in reversed(self.files):
            if f.start <= queue_offset:
                return f if queue_offset < f.end else None
        return None


class MapCache:
    """At most ``limit`` files mapped at once; CLOCK (second chance) eviction.

    A hit costs one attribute store (``referenced = True``); only misses touch
    the ring. Evicting a dirty file msyncs it first, so ``flush`` never needs
    to reopen a file.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._ring: dict[QueueFile, None] = {}

    def get(self, f: QueueFile) -> mmap.mmap:
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
        # Page-sized faults: appended entries would otherwise grow large folios and each
        # flush write back 2 MiB for a few 20-byte entries (see halfmoon.store.commitlog).
        mm.madvise(mmap.MADV_RANDOM)
        f.mm = mm
        f.referenced = False
        self._ring[f] = None
        return mm

    def drop(self, f: QueueFile, *, sync: bool) -> None:
        if f.mm is not None:
            self._ring.pop(f, None)
            self._unmap(f, sync=sync)

    def forget(self, f: QueueFile) -> None:
        """Unmap ``f`` without syncing and delete its file (it is no longer wanted)."""
        self.drop(f, sync=False)
        f.dirty = False
        f.path.unlink(missing_ok=True)

    @staticmethod
    def _unmap(f: QueueFile, *, sync: bool) -> None:
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
