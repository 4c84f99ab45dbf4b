"""Lenient repair of mid-log damage: keep the evidence, then blank the damaged bytes.

Lenient recovery drops a damaged region of the commit log by covering it with
blank records. Before it does, the region's bytes are copied to
``<commitlog dir>/<20-digit offset>.broken`` (as etcd's WAL repair keeps a
``.broken`` file), so an operator can still inspect what was dropped. The
copy is exactly the dropped bytes: byte ``i`` of the file is commit-log
offset ``offset + i``. Holes of the sparse segments stay holes in the copy.

The copy is durable (written beside, fsynced, renamed, directory fsynced)
before a single byte is blanked: a crash in between repeats the repair on the
next open, and an identical copy is then kept as it is. A copy is never
overwritten: a different one for the same offset (damage found again after a
torn blanking) goes to ``<offset>.<n>.broken``. Nothing deletes these files;
they are the operator's to remove.
"""

from __future__ import annotations

import filecmp
import os
from pathlib import Path

from halfmoon.store.commitlog import CommitLog, segment_name
from halfmoon.store.fsutil import data_regions, fsync_directory

BROKEN_SUFFIX = ".broken"
_CHUNK = 1 << 20  # bytes per write: bounds the memory a large region needs


def repair(commitlog: CommitLog, start: int, end: int) -> Path:
    """Copy [start, end) aside, then blank it in the log; return the copy's path."""
    copy = copy_aside(commitlog, start, end)
    commitlog.blank_out(start, end)
    return copy


def copy_aside(commitlog: CommitLog, start: int, end: int) -> Path:
    """Durably copy the commit log's bytes [start, end) to a ``.broken`` file; return its path."""
    directory = commitlog.directory
    temporary = directory / (segment_name(start) + BROKEN_SUFFIX + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, end - start)  # what is never written below stays a hole
        for segment in commitlog.segments:
            a, b = max(start, segment.start), min(end, segment.end)
            if a >= b:
                continue
            for data, hole in data_regions(segment.fd, a - segment.start, b - segment.start):
                for position in range(data, hole, _CHUNK):
                    chunk = segment.mm[position : min(position + _CHUNK, hole)]
                    _write_all(fd, chunk, segment.start + position - start)
        os.fsync(fd)
    finally:
        os.close(fd)
    target = _free_name(directory, start, temporary)
    if target.exists():  # the same bytes, saved by an earlier attempt at this repair
        temporary.unlink()
        return target
    os.replace(temporary, target)
    fsync_directory(directory)
    return target


def _write_all(fd: int, data: bytes, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


def _free_name(directory: Path, start: int, candidate: Path) -> Path:
    """The name for ``candidate``'s bytes: an existing identical copy, or the first free name."""
    name = segment_name(start)
    target = directory / (name + BROKEN_SUFFIX)
    n = 0
    while target.exists():
        if filecmp.cmp(target, candidate, shallow=False):
            return target
        n += 1
        target = directory / f"{name}.{n}{BROKEN_SUFFIX}"
    return target
