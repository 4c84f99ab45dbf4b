"""The key index: message key -> commit-log offsets, as on-disk hash tables.

Modelled on RocketMQ's IndexFile. Files live in ``<root>/`` as
``<20-digit sequence number>.idx``; each is created at full size (sparse) and
memory-mapped. A file is::

    header (64 bytes, big-endian)
        0  4s magic b"HMKI"      4  u16 version      6  u16 flags (bit 0: closed cleanly)
        8  u32 slot count       12  u32 entry capacity
        16 i64 begin timestamp  24 i64 begin commit-log offset
        32 i64 end timestamp    40 i64 end commit-log offset    48 u32 entry count
    slot table: slot count x u32, entry number + 1 of the newest entry whose
        hash falls in that slot (0 = none)
    entries: capacity x 20 bytes:
        u32 key hash, i64 commit-log offset, u32 milliseconds since the begin
        timestamp (clamped at 0), u32 entry number + 1 of the previous entry
        in the same slot (0 = end of chain)

The hashed key is ``f"{topic}#{key}"`` (CRC-32 of its UTF-8 bytes). A file is
full after its capacity, or when a timestamp no longer fits the u32 delta
(49 days); then the next file starts.

Entries are appended in commit-log order (the dispatcher walks the log), so
within and across files offsets never decrease. ``put`` relies on that to be
idempotent under re-dispatch: an offset below the highest one indexed is
ignored. ``truncate_from`` undoes the newest entries in reverse order, which
restores the slot table exactly.

Crash safety: the clean flag is cleared while a file is the write target and
set on ``close`` (and when a full file is left behind). A file found without
it is validated on open: the longest plausible prefix of the entries its
header counts is kept and its slot table rebuilt (a warning says how many
entries were dropped). The header's count and end fields are brought up to
date by ``flush`` (every checkpoint), not by each ``put``: entries past a
stale count are ignored, and recovery re-dispatches everything from the
checkpoint's dispatched offset, which is never past the flushed header's
end. The index is rebuildable from the commit log (``reset`` + re-dispatch).

Memory: only the newest file plus ``max_open_files - 1`` recently queried
files are mapped; the per-file metadata list grows one item per file.
Thread safety: every public method takes one lock.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from zlib import crc32

from halfmoon.errors import InvalidArgument
from halfmoon.store.fsutil import fsync_directory, fsync_file, make_directory

log = logging.getLogger("halfmoon.store")

MAGIC = b"HMKI"
VERSION = 1
FLAG_CLEAN = 0x1
_HEADER = struct.Struct(">4sHHIIqqqqI")
HEADER_SIZE = 64
_HEADER_TAIL = struct.Struct(">qqI")  # end timestamp, end offset, entry count
_HEADER_TAIL_AT = 32
_FLAGS = struct.Struct(">H")
_FLAGS_AT = 6
ENTRY = struct.Struct(">IqII")  # key hash, commit-log offset, time delta, previous
ENTRY_SIZE = ENTRY.size  # 20
_U32 = struct.Struct(">I")
_PREV_AT = 16  # byte position of the previous-entry field inside an entry
MAX_DELTA = 0xFFFFFFFF
_FILE_NAME = re.compile(r"^(\d{20})\.idx$")


class _IndexFile:
    __slots__ = (
        "path", "sequence", "slots", "entries_at", "capacity", "begin_timestamp", "begin_offset",
        "end_timestamp", "end_offset", "count", "mm", "dirty",
    )  # fmt: skip

    def __init__(self, path: Path, sequence: int, slots: int, capacity: int) -> None:
        self.path = path
        self.sequence = sequence
        self.slots = slots
        self.entries_at = HEADER_SIZE + slots * 4  # where the entries start (after the slots)
        self.capacity = capacity
        self.begin_timestamp = 0
        self.begin_offset = 0
        self.end_timestamp = 0
        self.end_offset = 0
        self.count = 0
        self.mm: mmap.mmap | None = None
        self.dirty = False

    @property
    def size(self) -> int:
        return self.entries_at + self.capacity * ENTRY_SIZE

    def write_header(self, mm: mmap.mmap | bytearray, flags: int) -> None:
        _HEADER.pack_into(
            mm, 0, MAGIC, VERSION, flags, self.slots, self.capacity, self.begin_timestamp,
            self.begin_offset, self.end_timestamp, self.end_offset, self.count,
        )  # fmt: skip


class KeyIndex:
    """Key -> candidate commit-log offsets; see the module docstring for the format."""

    def __init__(
        self,
        root: Path,
        slots: int = 500_000,
        max_entries: int = 2_000_000,
        *,
        max_open_files: int = 4,
    ) -> None:
        if slots < 1 or max_entries < 1:
            raise InvalidArgument("the key index needs at least one slot and one entry per file")
        self.root = Path(root)
        self.slots = slots
        self.max_entries = max_entries
        self._max_open_old = max(0, max_open_files - 1)
        self._files: list[_IndexFile] = []
        self._old_maps: OrderedDict[_IndexFile, None] = OrderedDict()
        self._trim_floor = 0  # offsets below were trimmed: never returned
        self._lock = threading.Lock()
        self._load()

    # -- opening -------------------------------------------------------------

    def _load(self) -> None:
        if not self.root.is_dir():
            return
        found = []
        for path in self.root.iterdir():
            match = _FILE_NAME.match(path.name)
            if match and path.is_file():
                found.append((int(match.group(1)), path))
            else:
                log.warning("key index: ignoring unexpected file %s", path)
        for sequence, path in sorted(found):
            try:
                f = self._open_file(path, sequence)
            except OSError as exc:
                log.warning("key index file %s unreadable, ignored: %s", path, exc)
                continue
            if f is None:
                continue
            if self._files and f.begin_offset < self._files[-1].end_offset:
                log.warning("key index file %s overlaps the previous file; deleting it", path)
                self._delete(f)
                continue
            self._files.append(f)
        if self._files:
            self._writable(self._files[-1])

    def _open_file(self, path: Path, sequence: int) -> _IndexFile | None:
        """Validate one file; None (and the file deleted) when nothing in it is usable."""
        length = path.stat().st_size
        header = b""
        if length >= HEADER_SIZE:
            with open(path, "rb") as fh:
                header = fh.read(_HEADER.size)
        fields = _HEADER.unpack(header) if len(header) == _HEADER.size else None
        if (
            fields is None
            or fields[0] != MAGIC
            or fields[1] != VERSION
            or fields[3] < 1
            or fields[4] < 1
            or length < HEADER_SIZE + fields[3] * 4
        ):
            log.warning("key index file %s has no valid header; deleting it", path)
            path.unlink()
            fsync_directory(path.parent)
            return None
        _, _, flags, slots, capacity, begin_ts, begin_off, end_ts, end_off, count = fields
        f = _IndexFile(path, sequence, slots, capacity)
        f.begin_timestamp, f.begin_offset = begin_ts, begin_off
        f.end_timestamp, f.end_offset, f.count = end_ts, end_off, count
        clean = bool(flags & FLAG_CLEAN)
        if length != f.size:
            log.warning(
                "key index file %s is %d bytes, expected %d; resizing and checking it",
                path, length, f.size,
            )  # fmt: skip
            os.truncate(path, f.size)
            clean = False
        if count > capacity:
            clean = False
        if not clean:
            self._repair(f, self._map(f))
            self._unmap(f)
        if f.count == 0:
            self._delete(f)
            return None
        return f

    def _repair(self, f: _IndexFile, mm: mmap.mmap) -> None:
        """Keep the longest plausible prefix of entries and rebuild the slot table from it."""
        claimed = min(f.count, f.capacity)
        kept = 0
        previous_offset = f.begin_offset
        max_delta = 0
        table = [0] * f.slots
        base = f.entries_at
        raw = mm[base : base + claimed * ENTRY_SIZE]
        for i, (h, offset, delta, prev) in enumerate(ENTRY.iter_unpack(raw)):
            if offset < previous_offset or prev > i or (i and not (h or offset or delta or prev)):
                break
            slot = h % f.slots
            if prev != table[slot]:
                _U32.pack_into(mm, base + i * ENTRY_SIZE + _PREV_AT, table[slot])
            table[slot] = i + 1
            previous_offset = offset
            max_delta = max(max_delta, delta)
            kept = i + 1
        mm[HEADER_SIZE:base] = struct.pack(f">{f.slots}I", *table)
        if kept < claimed:
            mm[base + kept * ENTRY_SIZE : base + claimed * ENTRY_SIZE] = bytes(
                (claimed - kept) * ENTRY_SIZE
            )
        log.warning(
            "key index file %s was not closed cleanly: kept %d of %d entries, slot table rebuilt",
            f.path, kept, f.count,
        )  # fmt: skip
        f.count = kept
        f.end_offset = previous_offset
        f.end_timestamp = f.begin_timestamp + max_delta
        f.write_header(mm, FLAG_CLEAN)
        mm.flush()

    # -- maps ----------------------------------------------------------------

    def _map(self, f: _IndexFile) -> mmap.mmap:
        if f.mm is None:
            fd = os.open(f.path, os.O_RDWR)
            try:
                f.mm = mmap.mmap(fd, f.size)
            finally:
                os.close(fd)
            # Slots are hashed and entries appended: page-sized faults, so a flush writes
            # back the pages written, not large folios (see halfmoon.store.commitlog).
            f.mm.madvise(mmap.MADV_RANDOM)
        return f.mm

    def _map_old(self, f: _IndexFile) -> mmap.mmap:
        """Map an older file for a query, keeping only a few such maps open."""
        if f.mm is not None:
            if f in self._old_maps:
                self._old_maps.move_to_end(f)
            return f.mm
        mm = self._map(f)
        self._old_maps[f] = None
        while len(self._old_maps) > self._max_open_old:
            victim, _ = self._old_maps.popitem(last=False)
            if victim is not f:
                self._unmap(victim)
        return mm

    def _unmap(self, f: _IndexFile) -> None:
        self._old_maps.pop(f, None)
        if f.mm is not None:
            if f.dirty:
                _HEADER_TAIL.pack_into(
                    f.mm, _HEADER_TAIL_AT, f.end_timestamp, f.end_offset, f.count
                )
                f.mm.flush()
                f.dirty = False
            f.mm.close()
            f.mm = None

    def _writable(self, f: _IndexFile) -> mmap.mmap:
        """Make ``f`` the write target: mapped for good and flagged as not clean."""
        self._old_maps.pop(f, None)
        mm = self._map(f)
        _FLAGS.pack_into(mm, _FLAGS_AT, 0)
        f.dirty = True
        return mm

    def _delete(self, f: _IndexFile) -> None:
        self._old_maps.pop(f, None)
        if f.mm is not None:
            f.mm.close()
            f.mm = None
        f.path.unlink(missing_ok=True)
        fsync_directory(f.path.parent)

    def open_file_count(self) -> int:
        return sum(1 for f in self._files if f.mm is not None)

    # -- writing -------------------------------------------------------------

    def put(self, topic: str, key: str, commit_log_offset: int, store_timestamp: int) -> None:
        self.put_keys(topic, (key,), commit_log_offset, store_timestamp)

    def put_keys(
        self, topic: str, keys: Iterable[str], commit_log_offset: int, store_timestamp: int
    ) -> None:
        """Index one record under each of ``keys``, taking the lock once.

        This runs for every appended message that has keys (its unique id at
        least), so it is one function with no helper calls per key.
        """
        prefix = topic + "#"
        with self._lock:
            for key in keys:
                h = crc32((prefix + key).encode())
                files = self._files
                f = files[-1] if files else None
                if f is not None:
                    if commit_log_offset < f.end_offset:
                        return  # re-dispatch of something already indexed
                    delta = store_timestamp - f.begin_timestamp
                    if f.count >= f.capacity or delta > MAX_DELTA:
                        f = None
                if f is None:
                    f = self._start_file(commit_log_offset, store_timestamp)
                    delta = 0
                elif delta < 0:
                    delta = 0  # the clock went back: record the file's begin time
                mm = f.mm if f.mm is not None else self._writable(f)
                slot_at = HEADER_SIZE + (h % f.slots) * 4
                n = f.count
                ENTRY.pack_into(
                    mm, f.entries_at + n * ENTRY_SIZE, h, commit_log_offset, delta,
                    _U32.unpack_from(mm, slot_at)[0],
                )  # fmt: skip
                n += 1
                _U32.pack_into(mm, slot_at, n)
                f.count = n
                f.end_offset = commit_log_offset
                if store_timestamp > f.end_timestamp:
                    f.end_timestamp = store_timestamp
                # The header's end fields and count are written by flush, not per
                # entry: see "Crash safety" above for why a stale header is safe.
                f.dirty = True

    def _start_file(self, commit_log_offset: int, store_timestamp: int) -> _IndexFile:
        if self._files:
            self._retire(self._files[-1])
        make_directory(self.root)
        sequence = self._files[-1].sequence + 1 if self._files else 0
        path = self.root / f"{sequence:020d}.idx"
        f = _IndexFile(path, sequence, self.slots, self.max_entries)
        f.begin_timestamp = f.end_timestamp = store_timestamp
        f.begin_offset = f.end_offset = commit_log_offset
        header = bytearray(HEADER_SIZE)
        f.write_header(header, 0)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, f.size)
            os.pwrite(fd, header, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_directory(self.root)
        self._files.append(f)
        self._writable(f)
        return f

    def _retire(self, f: _IndexFile) -> None:
        """A full file is left behind: flush it, flag it clean, unmap it."""
        mm = self._map(f)
        f.write_header(mm, FLAG_CLEAN)
        mm.flush()
        f.dirty = False
        self._unmap(f)

    def truncate_from(self, commit_log_offset: int) -> None:
        with self._lock:
            while self._files and self._files[-1].begin_offset >= commit_log_offset:
                self._delete(self._files.pop())
            if not self._files:
                return
            f = self._files[-1]
            mm = self._writable(f)
            if f.end_offset < commit_log_offset:
                return
            base = f.entries_at
            lo, hi = 0, f.count
            while lo < hi:
                mid = (lo + hi) // 2
                if ENTRY.unpack_from(mm, base + mid * ENTRY_SIZE)[1] < commit_log_offset:
                    lo = mid + 1
                else:
                    hi = mid
            # Undo newest first: each entry's slot goes back to its previous entry.
            for i in range(f.count - 1, lo - 1, -1):
                h, _, _, prev = ENTRY.unpack_from(mm, base + i * ENTRY_SIZE)
                _U32.pack_into(mm, HEADER_SIZE + (h % f.slots) * 4, prev)
            mm[base + lo * ENTRY_SIZE : base + f.count * ENTRY_SIZE] = bytes(
                (f.count - lo) * ENTRY_SIZE
            )
            f.count = lo
            f.end_offset = ENTRY.unpack_from(mm, base + (lo - 1) * ENTRY_SIZE)[1]
            # The end timestamp stays: an upper bound is all queries need.
            f.write_header(mm, 0)
            f.dirty = True

    def trim_below(self, commit_log_offset: int) -> None:
        """Delete files wholly below the offset; the newest file stays (it holds the max)."""
        with self._lock:
            self._trim_floor = max(self._trim_floor, commit_log_offset)
            while len(self._files) > 1 and self._files[0].end_offset < commit_log_offset:
                self._delete(self._files.pop(0))

    def reset(self) -> None:
        with self._lock:
            for f in self._files:
                self._delete(f)
            self._files = []
            self._old_maps.clear()
            self._trim_floor = 0

    # -- reading -------------------------------------------------------------

    def query(
        self, topic: str, key: str, begin_timestamp: int, end_timestamp: int, max_results: int
    ) -> list[int]:
        """Candidate offsets for the key stored within [begin, end] ms, newest first."""
        h = zlib.crc32(f"{topic}#{key}".encode())
        results: list[int] = []
        if max_results <= 0 or begin_timestamp > end_timestamp:
            return results
        seen: set[int] = set()
        with self._lock:
            newest = self._files[-1] if self._files else None
            for f in reversed(self._files):
                if len(results) >= max_results or f.end_offset < self._trim_floor:
                    break
                if f.end_timestamp < begin_timestamp or f.begin_timestamp > end_timestamp:
                    continue
                mm = f.mm if f is newest and f.mm is not None else self._map_old(f)
                base = f.entries_at
                n = _U32.unpack_from(mm, HEADER_SIZE + (h % f.slots) * 4)[0]
                while 0 < n <= f.count:
                    entry_hash, offset, delta, prev = ENTRY.unpack_from(
                        mm, base + (n - 1) * ENTRY_SIZE
                    )
                    if (
                        entry_hash == h
                        and begin_timestamp <= f.begin_timestamp + delta <= end_timestamp
                        and offset >= self._trim_floor
                        and offset not in seen
                    ):
                        seen.add(offset)
                        results.append(offset)
                        if len(results) >= max_results:
                            break
                    if prev >= n:
                        break  # a chain only goes back; anything else is damage
                    n = prev
        return results

    def max_commit_log_offset(self) -> int:
        """The highest commit-log offset indexed, or -1 when the index is empty."""
        with self._lock:
            return self._files[-1].end_offset if self._files else -1

    # -- durability ----------------------------------------------------------

    def flush(self) -> None:
        # Header under the lock; the fsync outside it and with the GIL released
        # (see ConsumeQueues.flush for why not mmap.flush).
        with self._lock:
            paths = []
            for f in self._files:
                if f.dirty and f.mm is not None:
                    _HEADER_TAIL.pack_into(
                        f.mm, _HEADER_TAIL_AT, f.end_timestamp, f.end_offset, f.count
                    )
                    paths.append(f.path)
                    f.dirty = False
        for path in paths:
            fsync_file(path)

    def close(self) -> None:
        with self._lock:
            if self._files:
                newest = self._files[-1]
                newest.write_header(self._map(newest), FLAG_CLEAN)
                newest.dirty = True
            for f in self._files:
                self._unmap(f)
            self._files = []
            self._old_maps.clear()
