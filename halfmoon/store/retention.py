"""Retention: delete the oldest commit-log segments once they are too old or the disk too full.

A segment's age is the store timestamp of the first record of the segment
after it (every record of a segment was stored before the next segment's
first record), falling back to the file's mtime. The segment being written is
never deleted. Consume queues and the key index are trimmed to the new
minimum *before* the segment goes, so no entry ever points at a deleted file.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from halfmoon.store.commitlog import CommitLog, Segment

log = logging.getLogger("halfmoon.store")


def disk_usage_ratio(path: Path) -> float:
    usage = shutil.disk_usage(path)
    return usage.used / usage.total if usage.total else 0.0


def segment_last_store_time(commitlog: CommitLog, segment: Segment, following: Segment) -> int:
    """An upper bound (ms) of the newest store timestamp in ``segment``."""
    first_of_next = commitlog.first_store_timestamp(following)
    if first_of_next is not None:
        return first_of_next
    try:
        return int(os.stat(segment.path).st_mtime * 1000)
    except OSError:
        return 0


def next_expired(
    commitlog: CommitLog,
    *,
    now_ms: int,
    retention_ms: int,
    max_disk_ratio: float,
    usage: Callable[[], float],
) -> tuple[Segment, str] | None:
    """The oldest segment if it must go (and why), else None."""
    segments = commitlog.segments
    if len(segments) < 2:
        return None
    oldest, following = segments[0], segments[1]
    if now_ms - segment_last_store_time(commitlog, oldest, following) >= retention_ms:
        return oldest, "expired"
    if usage() > max_disk_ratio:
        return oldest, "disk_full"
    return None
