"""Crash recovery: find the commit log's true end, then make the indexes agree with it.

Algorithm (``recover``):

1. After a clean close (no abort marker, valid checkpoint) the checkpoint's
   flushed offset is the end: nothing is scanned.
2. After a crash, scan from the checkpoint's flushed offset (from the start
   of the log if the checkpoint is missing or corrupt). Each record must
   frame, match its CRC and name its own offset. At the first bad record,
   look for any valid record after it (rest of the segment, then the first
   record of each later segment):

   - none: a torn tail (the writer died mid-record). Cut quietly.
   - one at offset q: mid-log damage. The reporter hears (offset, bytes
     dropped); ``strict`` raises :class:`CorruptionError`, ``lenient`` copies
     the damaged bytes to a ``.broken`` file (see ``repair``), blanks them,
     skips to q and goes on.

   The log is cut at the end found (garbage after it zeroed, later segments
   removed), so work is proportional to the unflushed tail.
3. Consume queues and the key index drop what lies at/after the end, then
   records from the checkpoint's dispatched offset are dispatched again
   (``ConsumeQueues.put`` is idempotent). A queue whose max offset is below
   the checkpoint's record of it (a truncated or missing file), or that
   reports a gap, is reset and rebuilt by reading the commit log from its
   start; so is the key index when its directory is missing or when there is
   no checkpoint to trust.
4. One structured log line reports what was done and how long it took,
   including where the copies of dropped bytes are (``broken_copies``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from halfmoon.errors import CorruptionError
from halfmoon.store import record
from halfmoon.store.checkpoint import CHECKPOINT_FILE, Checkpoint
from halfmoon.store.commitlog import CommitLog, Segment
from halfmoon.store.consumequeue import ConsumeQueues, QueueGapError
from halfmoon.store.keyindex import KeyIndex
from halfmoon.store.message import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQUE_ID,
    StoredMessage,
    tag_hash,
)
from halfmoon.store.repair import repair

log = logging.getLogger("halfmoon.store")

# reporter(offset, bytes_dropped, reason): told about every damaged region found.
Reporter = Callable[[int, int, str], None]


def log_reporter(offset: int, dropped: int, reason: str) -> None:
    log.error(
        "event=commitlog_corruption offset=%d bytes_dropped=%d reason=%s", offset, dropped, reason
    )


def index_keys(properties: dict[str, str]) -> list[str]:
    """The keys a message is indexed under: its KEYS (space separated) and its unique id."""
    keys = properties.get(PROPERTY_KEYS)
    found = [k for k in keys.split(KEY_SEPARATOR) if k] if keys else []
    unique = properties.get(PROPERTY_UNIQUE_ID)
    if unique and unique not in found:
        found.append(unique)
    return found


def dispatch(
    message: StoredMessage,
    queues: ConsumeQueues | None,
    index: KeyIndex | None,
) -> None:
    """Write one record's consume-queue entries (one per destination: a fanout record has
    several) and key-index entries (per destination topic) (recovery's path)."""
    if queues is not None:
        for topic, queue_id, queue_offset in message.placements():
            _put_entry(queues, message, topic, queue_id, queue_offset)
    if index is not None:
        keys = index_keys(message.properties)
        topics = dict.fromkeys(t for t, _, _ in message.placements())
        for topic in topics:
            for key in keys:
                index.put(topic, key, message.commit_log_offset, message.store_timestamp)


def _put_entry(
    queues: ConsumeQueues, message: StoredMessage, topic: str, queue_id: int, queue_offset: int
) -> None:
    """The consume-queue entry of one of the record's destinations."""
    queues.put(
        topic,
        queue_id,
        queue_offset,
        message.commit_log_offset,
        message.size,
        tag_hash(message.properties.get(PROPERTY_TAGS)),
    )


@dataclass
class RecoveryReport:
    crashed: bool
    checkpoint: str  # "valid", "missing" or "corrupt"
    scan_start: int
    end: int
    bytes_scanned: int = 0
    redispatched_from: int = 0
    rebuilt_queues: list[tuple[str, int]] = field(default_factory=list)
    index_rebuilt: bool = False
    damaged: list[tuple[int, int]] = field(default_factory=list)  # (offset, bytes dropped)
    broken_copies: list[Path] = field(default_factory=list)  # what lenient recovery dropped
    duration: float = 0.0


def _next_valid(commitlog: CommitLog, segment: Segment, relative: int) -> int | None:
    """Absolute offset of the first valid record after ``relative`` in ``segment`` or later."""
    found = segment.find_record(relative)
    if found is not None:
        return segment.start + found
    for later in commitlog.segments:
        if later.start > segment.start:
            found = later.find_record(0)
            if found is not None:
                return later.start + found
    return None


def scan(
    commitlog: CommitLog, start: int, policy: str, reporter: Reporter, report: RecoveryReport
) -> int:
    """Return the end of the valid log, scanning from ``start`` (a record boundary)."""
    position = start
    while True:
        segment = commitlog.segment_for(position)
        if segment is None:
            return position
        relative = position - segment.start
        left = segment.size - relative
        if left < record.BLANK_SIZE:
            position = segment.end
            continue
        total, magic = record.FRAME.unpack_from(segment.mm, relative)
        if magic == record.BLANK_MAGIC and record.BLANK_SIZE <= total <= left:
            position += total
            continue
        if segment.is_record_at(relative):
            position += total
            report.bytes_scanned += total
            continue
        found = _next_valid(commitlog, segment, relative + 1)
        if found is None:
            return position  # a torn tail or the clean end of the data: cut quietly
        reason = "bad_crc" if magic == record.MESSAGE_MAGIC else "bad_frame"
        reporter(position, found - position, reason)
        report.damaged.append((position, found - position))
        if policy == "strict":
            raise CorruptionError(
                f"the commit log is damaged at offset {position} ({found - position} bytes "
                f"before the next valid record); restore the data directory from a replica, "
                "or open it with recovery='lenient' to drop the damaged bytes"
            )
        # Blank the damage so reads through stale consume-queue entries find no
        # record there, after keeping a copy of it for whoever investigates.
        copy = repair(commitlog, position, found)
        report.broken_copies.append(copy)
        log.warning(
            "event=commitlog_repair offset=%d bytes_dropped=%d copy=%s",
            position,
            found - position,
            copy,
        )
        position = found


def _records(
    commitlog: CommitLog, start: int, end: int, skip_damaged: bool
) -> Iterator[StoredMessage]:
    """Records in [start, end); damaged regions (already reported) are skipped if allowed."""
    position = max(start, commitlog.min_offset)
    while position < end:
        try:
            for message in commitlog.records(position, end):
                position = message.commit_log_offset + message.size
                yield message
            return
        except CorruptionError:
            if not skip_damaged:
                raise
            segment = commitlog.segment_for(position)
            assert segment is not None
            found = _next_valid(commitlog, segment, position - segment.start + 1)
            if found is None or found >= end:
                return
            position = found


def recover(
    commitlog: CommitLog,
    queues: ConsumeQueues,
    index: KeyIndex,
    checkpoint: Checkpoint | None,
    *,
    data_dir: Path,
    crashed: bool,
    index_missing: bool,
    policy: str,
    reporter: Reporter,
) -> RecoveryReport:
    started = time.monotonic()
    log_min = commitlog.min_offset
    last_end = commitlog.segments[-1].end if commitlog.segments else log_min
    state = (
        "valid"
        if checkpoint
        else ("corrupt" if (data_dir / CHECKPOINT_FILE).exists() else "missing")
    )
    usable = checkpoint is not None and log_min <= checkpoint.flushed_offset <= last_end
    scan_start = checkpoint.flushed_offset if usable and checkpoint else log_min
    report = RecoveryReport(crashed, state, scan_start, scan_start)
    if crashed or not usable:
        report.end = scan(commitlog, scan_start, policy, reporter, report)
        commitlog.truncate(report.end)
    else:
        commitlog.resume(report.end)
    end = report.end

    queues.truncate_from(end)
    index.truncate_from(end)
    rebuild_index = (index_missing or not usable) and end > log_min
    rebuild: set[tuple[str, int]] = set()
    if usable and checkpoint:
        rebuild = {q for q, m in checkpoint.queue_offsets.items() if queues.max_offset(*q) < m}
        report.redispatched_from = min(max(checkpoint.dispatched_offset, log_min), end)
    else:
        report.redispatched_from = log_min
    skip = policy == "lenient"
    indexed_up_to = -1 if rebuild_index else index.max_commit_log_offset()  # it ignores lower ones
    for message in _records(commitlog, report.redispatched_from, end, skip):
        for topic, queue_id, queue_offset in message.placements():
            key = (topic, queue_id)
            if key not in rebuild:
                try:
                    _put_entry(queues, message, topic, queue_id, queue_offset)
                except QueueGapError:
                    rebuild.add(key)
        if not rebuild_index and message.commit_log_offset >= indexed_up_to:
            dispatch(message, None, index)
    if rebuild or rebuild_index:
        _rebuild(commitlog, queues, index, rebuild, rebuild_index, end, skip)
    report.rebuilt_queues = sorted(rebuild)
    report.index_rebuilt = rebuild_index
    queues.flush()
    index.flush()
    report.duration = time.monotonic() - started
    log.info(
        "event=recovery crashed=%s checkpoint=%s scan_from=%d end=%d bytes_scanned=%d "
        "redispatched_from=%d rebuilt_queues=%d index_rebuilt=%s damaged_regions=%d "
        "broken_copies=%s duration_ms=%.1f",
        crashed,
        state,
        report.scan_start,
        end,
        report.bytes_scanned,
        report.redispatched_from,
        len(rebuild),
        rebuild_index,
        len(report.damaged),
        ",".join(map(str, report.broken_copies)) or "-",
        report.duration * 1000,
    )
    return report


def _rebuild(
    commitlog: CommitLog,
    queues: ConsumeQueues,
    index: KeyIndex,
    rebuild: set[tuple[str, int]],
    rebuild_index: bool,
    end: int,
    skip: bool,
) -> None:
    """Rebuild the named queues (and the index) by reading the whole retained log."""
    for topic, queue_id in rebuild:
        log.warning("event=consume_queue_rebuild topic=%s queue_id=%d", topic, queue_id)
        queues.reset_queue(topic, queue_id)
    if rebuild_index:
        log.warning("event=key_index_rebuild")
        index.reset()
    broken: set[tuple[str, int]] = set()
    for message in _records(commitlog, commitlog.min_offset, end, skip):
        for topic, queue_id, queue_offset in message.placements():
            key = (topic, queue_id)
            if key in rebuild and key not in broken:
                try:
                    _put_entry(queues, message, topic, queue_id, queue_offset)
                except QueueGapError as exc:
                    broken.add(key)
                    log.error(
                        "event=consume_queue_gap topic=%s queue_id=%d error=%r", *key, str(exc)
                    )
        if rebuild_index:
            dispatch(message, None, index)
