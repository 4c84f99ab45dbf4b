"""File-system steps shared by the store and the broker's metadata files.

Durable creation, renaming and deletion (each followed by the fsyncs that make
it survive a crash), and the walk over a sparse file's written regions.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path


def fsync_file(path: Path) -> None:
    """fsync a file by path; a file deleted meanwhile (retention) needs nothing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(path: Path) -> None:
    """Make a file creation, rename or deletion in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_directory(path: Path) -> None:
    """Create ``path`` (and parents) and fsync each new entry into its parent."""
    if path.is_dir():
        return
    make_directory(path.parent)
    try:
        path.mkdir()
    except FileExistsError:
        return
    fsync_directory(path.parent)


def replace_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old file or the new one.

    Write a temporary file beside it, fsync it, rename it over ``path``, fsync
    the directory.
    """
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


def data_regions(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The written (non-hole) parts of [start, end) of the file ``fd``, as (from, to) pairs.

    Located with SEEK_DATA / SEEK_HOLE, so the untouched part of a sparse file
    costs nothing to skip. A file system without hole support reports the
    whole file as data, which is correct, only slower.
    """
    position = start
    while position < end:
        try:
            data = os.lseek(fd, position, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data at or after position
                return
            raise
        if data >= end:
            return
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        yield data, hole
        position = hole
