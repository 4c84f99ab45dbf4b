"""Commit-log bytes as they travel from a master to its replicas: cut into chunks, checked.

A master ships its log as it lies on disk, byte for byte, so a replica's log
is identical to the master's up to the replicated offset (same segment size,
same fillers, same offsets in every record). Two rules keep the replica's
side simple:

- a chunk never crosses a segment boundary and always ends on a record
  boundary (a message record, a blank filler, or the zero tail closing a
  segment), so every chunk can be appended and dispatched on its own;
- every record in a chunk is checked before any of it is written: it frames,
  matches its CRC and names the commit-log offset it is written at.
  :func:`parse_chunk` raises :class:`ShippedDataError` otherwise.
"""

from __future__ import annotations

from halfmoon.errors import CorruptionError
from halfmoon.store import record
from halfmoon.store.commitlog import CommitLog, OffsetGone
from halfmoon.store.message import StoredMessage


class ShippedDataError(CorruptionError):
    """Bytes received from a master that are not a well-formed piece of its commit log."""

    code = "REPLICATION_DATA_INVALID"
    protocol_code = "INTERNAL_ERROR"


def read_chunk(commitlog: CommitLog, start: int, end: int, max_bytes: int) -> bytes:
    """The log's bytes from ``start`` (a record boundary) up to at most ``max_bytes``.

    Stops at ``end`` (what may be shipped: the master's visible end), at the
    end of ``start``'s segment, and at the last whole record that fits in
    ``max_bytes`` (at least one record, whatever its size). Empty when
    nothing is there yet. Raises :class:`OffsetGone` when ``start`` is below
    the retained log.
    """
    segment = commitlog.segment_for(start)
    if segment is None:
        if start >= commitlog.write_position or start >= end:
            return b""
        raise OffsetGone(start)
    limit = min(end, segment.end)
    mm = segment.mm
    base = segment.start
    position = start
    stop = min(limit, start + max(max_bytes, 1))
    while position < limit:
        relative = position - base
        if segment.end - position < record.BLANK_SIZE:
            size = segment.end - position  # the zero tail of a segment
        else:
            total, magic = record.FRAME.unpack_from(mm, relative)
            # zeros left by a roll are the rest of the segment
            size = segment.end - position if total == 0 and magic == 0 else total
        if size <= 0 or position + size > limit:
            break  # a zero tail whose segment is not yet closed, or not shipped yet
        if position + size > stop and position > start:
            break
        position += size
    try:
        return bytes(mm[start - base : position - base])
    except ValueError:  # closed by retention under our feet
        raise OffsetGone(start) from None


def parse_chunk(data: bytes, start: int, segment_size: int) -> list[StoredMessage]:
    """The messages of a shipped chunk at ``start``, every byte of it checked (see the module)."""
    segment_start = start - start % segment_size
    segment_end = segment_start + segment_size
    if start + len(data) > segment_end:
        raise ShippedDataError(
            f"a chunk of {len(data)} bytes at {start} crosses the segment boundary at "
            f"{segment_end}: master and replica must use the same store.segment_size"
        )
    messages: list[StoredMessage] = []
    position = 0
    view = memoryview(data)
    while position < len(data):
        left_in_segment = segment_end - (start + position)
        if left_in_segment < record.BLANK_SIZE or _is_zero(view[position : position + 8]):
            if any(view[position:]) or start + len(data) != segment_end:
                raise ShippedDataError(f"a zero tail at {start + position} that is not zero")
            break
        try:
            total, magic = record.frame_at(data, position, len(data))
        except record.RecordError as exc:
            raise ShippedDataError(f"an unframed record at {start + position}: {exc}") from None
        if magic == record.MESSAGE_MAGIC:
            try:
                message = record.decode(data, position, position + total, base_offset=start)
            except record.RecordError as exc:
                raise ShippedDataError(f"a bad record at {start + position}: {exc}") from None
            if message.commit_log_offset != start + position:
                raise ShippedDataError(
                    f"the record at {start + position} names offset {message.commit_log_offset}"
                )
            messages.append(message)
        elif start + position + total != segment_end:
            raise ShippedDataError(f"a blank filler at {start + position} not closing a segment")
        position += total
    return messages


def _is_zero(head: memoryview) -> bool:
    return len(head) == record.BLANK_SIZE and not any(head)
