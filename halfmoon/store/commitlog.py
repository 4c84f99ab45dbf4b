"""The commit log: every record of every topic, appended to fixed-size segments.

A segment is one file named by the 20-digit commit-log offset of its first
byte, created at its full size as a sparse file and memory-mapped. Writes are
copies into the mapping (the page cache); durability comes from
``fdatasync`` on the segment's descriptor, which writes back the pages the
mapping dirtied. A record never straddles two segments (see ``record``).

The part of the segment being appended to that lies ahead of (and just behind)
the write position is mapped with ``MADV_RANDOM``. Appends fault its pages in
one after another, and a file system with large folios (XFS; ext4 since Linux
6.16) reads that as a sequential reader and grows the folios it allocates, up
to 2 MiB; dirtying one byte then dirties the whole folio, and every fdatasync
writes it back: 2 MiB per sync-flushed message deep into a segment instead of
a page, four times the fsync's time on this project's test machine
(docs/storage-format.md). Random advice keeps the faults to one page. It also
stops read-ahead, which a reader of what is written wants (a cold read of the
log page by page is ten times slower), so the written part further behind
than :data:`READ_AHEAD_MARGIN` gets the default advice back every
:data:`READVISE_EVERY` bytes appended, and a segment the log rolled past gets
it whole.

Concurrency: one writer at a time (the store's append lock); readers never
lock. The segment list is replaced, never mutated, so a reader always sees a
consistent list; a reader racing with retention may find its segment closed
and gets :class:`OffsetGone`.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from zlib import crc32

from halfmoon.errors import CorruptionError
from halfmoon.store import record
from halfmoon.store.fsutil import data_regions, fsync_directory
from halfmoon.store.message import StoredMessage

_MAGIC_BYTES = record.MESSAGE_MAGIC.to_bytes(4, "big")
_ZERO_CHUNK = bytes(1 << 20)
# Behind the write position, random advice covers this much: read-ahead from a fault just
# behind it could otherwise reach past it and fill the unwritten pages with large folios.
READ_AHEAD_MARGIN = 32 << 20
READVISE_EVERY = 64 << 20  # appended bytes between two moves of that boundary
# record.seal's steps, bound once: write_record inlines them (see there).
_pack_store_fields = record.STORE_FIELDS.pack_into
_pack_i64 = record.I64.pack_into
_pack_crc = record.CRC.pack_into


class OffsetGone(LookupError):
    """Nothing readable at a commit-log offset (below the minimum, past the end, or not a
    record)."""


def segment_name(start: int) -> str:
    return f"{start:020d}"


class Segment:
    """One mapped segment file."""

    __slots__ = ("start", "size", "end", "path", "fd", "mm")

    def __init__(self, path: Path, start: int, size: int) -> None:
        self.start = start
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            actual = os.fstat(self.fd).st_size
            if actual < size:
                os.ftruncate(self.fd, size)  # sparse: blocks are allocated as pages are written
            else:
                size = actual  # an existing segment keeps the size it was created with
            self.size = size
            self.end = start + size  # a plain attribute: the append path reads it per record
            self.mm = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)

    def advise(self, written: int | None) -> None:
        """Read-ahead where nothing will be appended any more, page-sized faults from
        :data:`READ_AHEAD_MARGIN` behind ``written`` (relative) on; ``None``: the segment
        is sealed (module docstring)."""
        if written is None:
            self.mm.madvise(mmap.MADV_NORMAL)
            return
        boundary = max(0, written - READ_AHEAD_MARGIN) // mmap.PAGESIZE * mmap.PAGESIZE
        if boundary:
            self.mm.madvise(mmap.MADV_NORMAL, 0, boundary)
        self.mm.madvise(mmap.MADV_RANDOM, boundary, self.size - boundary)

    def find_record(self, relative: int) -> int | None:
        """First relative position >= ``relative`` holding a valid message record, or None.

        Used only by recovery to tell a torn tail from mid-file damage. Data
        regions are located with SEEK_DATA so the untouched sparse part of a
        segment costs nothing; a candidate must frame, match its CRC and name
        its own commit-log offset.
        """
        for data, hole in data_regions(self.fd, relative, self.size):
            at = self.mm.find(_MAGIC_BYTES, max(data, relative + record.MAGIC_AT), hole)
            while at != -1:
                candidate = at - record.MAGIC_AT
                if self.is_record_at(candidate):
                    return candidate
                at = self.mm.find(_MAGIC_BYTES, at + 1, hole)
        return None

    def is_record_at(self, relative: int) -> bool:
        try:
            total, magic = record.frame_at(self.mm, relative, self.size)
        except record.RecordError:
            return False
        if magic != record.MESSAGE_MAGIC or not record.check_crc(self.mm, relative, total):
            return False
        offset: int = record.I64.unpack_from(self.mm, relative + record.COMMIT_LOG_OFFSET_AT)[0]
        return offset == self.start + relative

    def zero_from(self, relative: int) -> None:
        """Overwrite whatever was written at or after ``relative`` with zeros."""
        for data, hole in data_regions(self.fd, relative, self.size):
            position = data
            while position < hole:
                n = min(len(_ZERO_CHUNK), hole - position)
                if self.mm[position : position + n] != _ZERO_CHUNK[:n]:
                    self.mm[position : position + n] = _ZERO_CHUNK[:n]
                position += n


class CommitLog:
    """The segment files of one commit log, with a write and a flushed position."""

    def __init__(self, directory: Path, segment_size: int) -> None:
        if segment_size < 4096 or segment_size % mmap.PAGESIZE:
            raise ValueError(f"segment_size must be a multiple of {mmap.PAGESIZE}, >= 4096")
        self.directory = directory
        self.segment_size = segment_size
        directory.mkdir(parents=True, exist_ok=True)
        self._segments: list[Segment] = []
        self._starts: list[int] = []
        self._sync_lock = threading.Lock()
        self._load()
        self.write_position = self._segments[0].start if self._segments else 0
        self.flushed_position = self.write_position
        self._readvise_at = self.write_position  # where write_record next moves the advice

    def _load(self) -> None:
        names = sorted(
            p for p in self.directory.iterdir() if p.name.isdigit() and len(p.name) == 20
        )
        segments: list[Segment] = []
        try:
            for path in names:
                segment = Segment(path, int(path.name), self.segment_size)
                if segments and segments[-1].end != segment.start:
                    segment.close()
                    raise CorruptionError(
                        f"commit-log segment {path.name} does not follow {segments[-1].path.name}: "
                        "a segment file is missing from the middle of the log; restore it or move "
                        "the later segments away"
                    )
                segments.append(segment)
        except BaseException:
            for segment in segments:
                segment.close()
            raise
        # Recovery reads the last segment before anything is appended: it keeps its
        # read-ahead until resume() or a truncation makes it the append target.
        self._set_segments(segments)

    def _set_segments(self, segments: list[Segment]) -> None:
        # Replace both lists at once; readers take one snapshot of each.
        last = self._segments[-1] if self._segments else None
        if last is not None and segments and last is not segments[-1] and last in segments:
            last.advise(None)  # rolled past: sealed
        self._segments = segments
        self._starts = [s.start for s in segments]

    def _advise_tail(self) -> None:
        """Random advice from just behind the write position on (module docstring)."""
        if self._segments:
            segment = self._segments[-1]
            position = min(max(self.write_position, segment.start), segment.end)
            segment.advise(position - segment.start)
        self._readvise_at = self.write_position + READVISE_EVERY

    def resume(self, end: int) -> None:
        """Continue appending at ``end``, everything below it durable (recovery found the log
        whole)."""
        self.write_position = self.flushed_position = end
        self._advise_tail()

    # -- positions -------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        segments = self._segments
        return segments[0].start if segments else self.write_position

    @property
    def segments(self) -> list[Segment]:
        return self._segments

    def segment_for(self, offset: int) -> Segment | None:
        segments = self._segments
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0 or i >= len(segments):
            return None
        segment = segments[i]
        return segment if offset < segment.end else None

    def disk_bytes(self) -> int:
        total = 0
        for segment in self._segments:
            with contextlib.suppress(OSError):
                total += os.fstat(segment.fd).st_blocks * 512
        return total

    # -- writing (caller holds the store's append lock) --------------------------

    def append(
        self, prepared: record.PreparedRecord, queue_offset: int, store_timestamp: int
    ) -> int:
        """Seal and write one record; return its commit-log offset."""
        return self.write_record(prepared.buffer, queue_offset, store_timestamp)

    def write_record(self, buffer: bytearray, queue_offset: int, store_timestamp: int) -> int:
        """Seal ``buffer`` (from ``record.encode_unsealed``) in place, write it, return its
        offset."""
        size = len(buffer)
        position = self.write_position
        segments = self._segments
        if not segments or position + size > segments[-1].end:
            self._roll(size)
            position = self.write_position
        segment = self._segments[-1]
        if position >= self._readvise_at:
            self._advise_tail()
        # record.seal, inlined: this runs once per appended message.
        _pack_store_fields(buffer, record.QUEUE_OFFSET_AT, queue_offset, position)
        _pack_i64(buffer, record.STORE_TIMESTAMP_AT, store_timestamp)
        _pack_crc(buffer, record.CRC_AT, crc32(memoryview(buffer)[record.CRC_START :]))
        relative = position - segment.start
        segment.mm[relative : relative + size] = buffer
        self.write_position = position + size
        return position

    def _roll(self, size: int) -> Segment:
        if size > self.segment_size:
            raise ValueError(f"a record of {size} bytes cannot fit in a segment")
        position = self.write_position
        current = self._segments[-1] if self._segments else None
        if current is not None and position < current.end:
            left = current.end - position
            if left >= record.BLANK_SIZE:
                relative = position - current.start
                current.mm[relative : relative + record.BLANK_SIZE] = record.FRAME.pack(
                    left, record.BLANK_MAGIC
                )
            position = current.end
        start = current.end if current is not None else position
        segment = Segment(self.directory / segment_name(start), start, self.segment_size)
        fsync_directory(self.directory)
        self._set_segments([*self._segments, segment])
        self.write_position = start
        self._advise_tail()
        return segment

    def write_raw(self, position: int, data: bytes) -> None:
        """Copy bytes a master wrote at ``position`` into this (a replica's) log.

        ``position`` must be the write position, and ``data`` one chunk of
        ``shipping``: within one segment. An empty log may start at any segment
        boundary (the master's retained log may not start at 0).
        """
        segments = self._segments
        if segments and position != self.write_position:
            raise ValueError(f"a replica writes at its end {self.write_position}, not {position}")
        if position % self.segment_size and (not segments or position >= segments[-1].end):
            raise ValueError(f"a new segment must start at a multiple of {self.segment_size}")
        if not segments or position == segments[-1].end:
            segment = Segment(self.directory / segment_name(position), position, self.segment_size)
            fsync_directory(self.directory)
            self._set_segments([*segments, segment])
            self.write_position = position
            self._advise_tail()
        elif position >= self._readvise_at:
            self._advise_tail()
        segment = self._segments[-1]
        if position + len(data) > segment.end:
            raise ValueError(f"{len(data)} bytes at {position} cross the segment's end")
        relative = position - segment.start
        segment.mm[relative : relative + len(data)] = data
        self.write_position = position + len(data)
        if not segments:
            self.flushed_position = position  # nothing below the first segment to flush

    # -- flushing -------------------------------------------------------------------

    def sync(self, up_to: int | None = None) -> int:
        """fdatasync every segment holding bytes in [flushed, up_to); return the new flushed
        position."""
        with self._sync_lock:
            target = self.write_position if up_to is None else up_to
            flushed = self.flushed_position
            if target <= flushed:
                return flushed
            for segment in self._segments:
                if segment.end > flushed and segment.start < target:
                    os.fdatasync(segment.fd)
            self.flushed_position = target
            return target

    # -- reading --------------------------------------------------------------------

    def read(self, offset: int, size: int) -> bytes:
        """The ``size`` bytes at ``offset`` (one record: never crosses a segment)."""
        segment = self.segment_for(offset)
        if segment is None or offset + size > self.write_position:
            raise OffsetGone(offset)
        relative = offset - segment.start
        try:
            data = segment.mm[relative : relative + size]
        except ValueError:  # closed by retention between lookup and read
            raise OffsetGone(offset) from None
        if len(data) != size:
            raise OffsetGone(offset)
        return data

    def read_message(self, offset: int, verify: bool = True) -> StoredMessage:
        """Decode the record starting at ``offset``; OffsetGone if there is none."""
        head = self.read(offset, record.BLANK_SIZE)
        total, magic = record.FRAME.unpack(head)
        if magic != record.MESSAGE_MAGIC:
            raise OffsetGone(offset)
        try:
            return record.decode(self.read(offset, total), verify=verify, base_offset=offset)
        except record.RecordError:
            raise OffsetGone(offset) from None

    def store_timestamp_at(self, offset: int) -> int:
        at = offset + record.STORE_TIMESTAMP_AT
        value: int = record.I64.unpack(self.read(at, record.I64.size))[0]
        return value

    def records(self, start: int, end: int | None = None) -> Iterator[StoredMessage]:
        """Decode records from ``start`` (a record boundary) to ``end`` (default: written end).

        For ranges already validated (below the write position after
        recovery): blank filler and short segment tails are skipped, anything
        else unreadable stops the iteration with CorruptionError.
        """
        position = start
        stop = self.write_position if end is None else end
        while position < stop:
            segment = self.segment_for(position)
            if segment is None:
                raise CorruptionError(f"commit log has no segment for offset {position}")
            relative = position - segment.start
            if segment.size - relative < record.BLANK_SIZE:
                position = segment.end
                continue
            total, magic = record.FRAME.unpack_from(segment.mm, relative)
            if (
                magic == record.BLANK_MAGIC
                and record.BLANK_SIZE <= total <= segment.size - relative
            ):
                position += total  # segment filler, or damage blanked by lenient recovery
                continue
            if total == 0 and magic == 0:
                position = segment.end
                continue
            try:
                message = record.decode(
                    segment.mm[relative : relative + total], verify=False, base_offset=position
                )
            except record.RecordError as exc:
                raise CorruptionError(f"unreadable record in the commit log: {exc}") from None
            yield message
            position += total

    # -- recovery and retention -----------------------------------------------------

    def truncate(self, end: int) -> None:
        """Make ``end`` the end of the log: zero what follows in its segment, drop later
        segments."""
        with self._sync_lock:
            self._truncate(end)

    def _truncate(self, end: int) -> None:
        keep = [s for s in self._segments if s.start <= end]
        drop = self._segments[len(keep) :]
        if keep and end < keep[-1].end:
            keep[-1].zero_from(end - keep[-1].start)
            os.fdatasync(keep[-1].fd)
        self._set_segments(keep)
        for segment in drop:
            segment.close()
            segment.path.unlink(missing_ok=True)
        if drop:
            fsync_directory(self.directory)
        self.write_position = end
        self.flushed_position = end
        self._advise_tail()

    def blank_out(self, start: int, end: int) -> None:
        """Cover [start, end) with blank records so no reader mistakes it for data (lenient
        recovery)."""
        for segment in self._segments:
            a, b = max(start, segment.start), min(end, segment.end)
            if b - a >= record.BLANK_SIZE:
                relative = a - segment.start
                segment.mm[relative : relative + (b - a)] = record.blank(b - a)
                os.fdatasync(segment.fd)

    def delete_oldest(self) -> Segment | None:
        """Delete the oldest segment unless it is the one being written; return it."""
        with self._sync_lock:  # the flusher must not fsync a descriptor being closed
            segments = self._segments
            if len(segments) < 2:
                return None
            oldest = segments[0]
            self._set_segments(segments[1:])
            oldest.close()
        oldest.path.unlink(missing_ok=True)
        fsync_directory(self.directory)
        return oldest

    def first_store_timestamp(self, segment: Segment) -> int | None:
        """Store timestamp of the first record of ``segment`` (None if it holds none)."""
        try:
            total, magic = record.FRAME.unpack_from(segment.mm, 0)
            if magic != record.MESSAGE_MAGIC or segment.start >= self.write_position:
                return None
            value: int = record.I64.unpack_from(segment.mm, record.STORE_TIMESTAMP_AT)[0]
        except (ValueError, struct.error):
            return None
        return value

    def close(self) -> None:
        for segment in self._segments:
            segment.close()
        self._set_segments([])
