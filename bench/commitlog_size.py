"""How far a data directory's commit log is written, read from its segment files.

Segments are created at full size as sparse files, so their apparent size never grows;
what grows is where the last non-zero byte of the newest segment lies. Only the last
written region is read (SEEK_DATA / SEEK_HOLE find it), so this is cheap on a large log.
The difference between two readings is the bytes the log took in between.
"""

from __future__ import annotations

import os
from pathlib import Path

from halfmoon.store.fsutil import data_regions


def commit_log_end(data_dir: Path) -> int:
    """The commit-log offset just past the last written byte under ``data_dir``."""
    [directory] = [p for p in data_dir.rglob("commitlog") if p.is_dir()]
    segments = [p for p in directory.iterdir() if p.name.isdigit() and len(p.name) == 20]
    if not segments:
        return 0
    last = max(segments)
    with open(last, "rb") as file:
        regions = list(data_regions(file.fileno(), 0, os.fstat(file.fileno()).st_size))
        if not regions:
            return int(last.name)
        start, end = regions[-1]
        file.seek(start)
        tail = file.read(end - start).rstrip(b"\0")
    return int(last.name) + start + len(tail)
