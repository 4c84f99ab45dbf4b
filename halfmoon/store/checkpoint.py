"""The checkpoint: how far the commit log is known good, in one small CRC-protected file.

Format (big-endian; ``docs/storage-format.md`` has the worked example)::

    u32  magic              CHECKPOINT_MAGIC ("HMCP")
    u16  version            1
    i64  flushed_offset     the commit log is durable below this offset
    i64  dispatched_offset  every record below is in the consume queues and the
                            key index, and those are flushed
    i64  timestamp          milliseconds since the epoch, when it was written
    u32  queue_count        then, per queue:
         u8   topic_length, topic (ASCII), i32 queue_id, i64 max_offset
    u32  crc                CRC-32 (zlib) of every byte before it

It is written to a temporary file, fsynced and renamed over the old one, so a
crash leaves either the old or the new checkpoint. A checkpoint that does not
parse or whose CRC is wrong is ignored (with a warning) and the store
recovers from the start of the commit log.

The abnormal-shutdown marker is an empty file created when the store opens
and removed after a clean close; finding it on open means the last run
crashed.
"""

from __future__ import annotations

import logging
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from halfmoon.store.fsutil import fsync_directory, replace_atomically

log = logging.getLogger("halfmoon.store")

CHECKPOINT_MAGIC = 0x484D4350  # "HMCP"
CHECKPOINT_VERSION = 1
CHECKPOINT_FILE = "checkpoint"
ABORT_MARKER_FILE = "abort"

_HEAD = struct.Struct(">IHqqqI")
_QUEUE = struct.Struct(">iq")
_CRC = struct.Struct(">I")


@dataclass(frozen=True)
class Checkpoint:
    flushed_offset: int
    dispatched_offset: int
    timestamp: int
    queue_offsets: dict[tuple[str, int], int] = field(default_factory=dict)


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    parts = [
        _HEAD.pack(
            CHECKPOINT_MAGIC,
            CHECKPOINT_VERSION,
            checkpoint.flushed_offset,
            checkpoint.dispatched_offset,
            checkpoint.timestamp,
            len(checkpoint.queue_offsets),
        )
    ]
    for (topic, queue_id), max_offset in sorted(checkpoint.queue_offsets.items()):
        name = topic.encode("ascii")
        parts.append(bytes((len(name),)) + name + _QUEUE.pack(queue_id, max_offset))
    body = b"".join(parts)
    return body + _CRC.pack(zlib.crc32(body))


class CheckpointError(ValueError):
    """The checkpoint bytes do not form a valid checkpoint."""


def decode_checkpoint(data: bytes) -> Checkpoint:
    if len(data) < _HEAD.size + _CRC.size:
        raise CheckpointError(f"{len(data)} bytes is too short for a checkpoint")
    (stored_crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    body = data[: -_CRC.size]
    if zlib.crc32(body) != stored_crc:
        raise CheckpointError("CRC mismatch")
    magic, version, flushed, dispatched, timestamp, count = _HEAD.unpack_from(body, 0)
    if magic != CHECKPOINT_MAGIC or version != CHECKPOINT_VERSION:
        raise CheckpointError(f"magic {magic:#x} version {version} not understood")
    position = _HEAD.size
    queues: dict[tuple[str, int], int] = {}
    try:
        for _ in range(count):
            n = body[position]
            topic = body[position + 1 : position + 1 + n].decode("ascii")
            queue_id, max_offset = _QUEUE.unpack_from(body, position + 1 + n)
            queues[(topic, queue_id)] = max_offset
            position += 1 + n + _QUEUE.size
    except (IndexError, UnicodeDecodeError, struct.error) as exc:
        raise CheckpointError(f"queue table does not parse: {exc}") from None
    if position != len(body):
        raise CheckpointError("trailing bytes after the queue table")
    return Checkpoint(flushed, dispatched, timestamp, queues)


def write_checkpoint(directory: Path, checkpoint: Checkpoint) -> None:
    """Replace the checkpoint atomically and durably."""
    replace_atomically(directory / CHECKPOINT_FILE, encode_checkpoint(checkpoint))


def read_checkpoint(directory: Path) -> Checkpoint | None:
    """The checkpoint, or None when it is missing or corrupt (a warning says which)."""
    path = directory / CHECKPOINT_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return decode_checkpoint(data)
    except CheckpointError as exc:
        log.warning(
            "event=checkpoint_ignored path=%s reason=%r action=full_recovery", path, str(exc)
        )
        return None


def mark_open(directory: Path) -> bool:
    """Create the abnormal-shutdown marker; return True if it was already there (a crash)."""
    path = directory / ABORT_MARKER_FILE
    existed = path.exists()
    if not existed:
        path.touch()
        fsync_directory(directory)
    return existed


def mark_clean_close(directory: Path) -> None:
    (directory / ABORT_MARKER_FILE).unlink(missing_ok=True)
    fsync_directory(directory)
