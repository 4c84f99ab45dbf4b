"""Byte-level damage for the store's failure-mode tests: flip, zero, truncate, fake a crash."""

from __future__ import annotations

import os
from pathlib import Path

from halfmoon.store.checkpoint import (
    ABORT_MARKER_FILE,
    CHECKPOINT_FILE,
    Checkpoint,
    write_checkpoint,
)


def segment_of(data_dir: Path, offset: int) -> tuple[Path, int]:
    """The commit-log segment file holding ``offset`` and the offset's position inside it."""
    segments = sorted((data_dir / "commitlog").iterdir())
    for path in reversed(segments):
        start = int(path.name)
        if start <= offset:
            return path, offset - start
    raise ValueError(f"no segment holds offset {offset}")


def flip_byte(path: Path, position: int, mask: int = 0xFF) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        value = f.read(1)[0]
        f.seek(position)
        f.write(bytes((value ^ mask,)))


def zero_range(path: Path, position: int, length: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(bytes(length))


def truncate(path: Path, size: int) -> None:
    os.truncate(path, size)


def flip_log_byte(data_dir: Path, offset: int, mask: int = 0xFF) -> None:
    path, position = segment_of(data_dir, offset)
    flip_byte(path, position, mask)


def zero_log_range(data_dir: Path, offset: int, length: int) -> None:
    path, position = segment_of(data_dir, offset)
    zero_range(path, position, length)


def simulate_crash(
    data_dir: Path, flushed_offset: int | None = None, *, remove_checkpoint: bool = False
) -> None:
    """Make a cleanly closed store look crashed.

    Puts the abort marker back and, when asked, rewinds the checkpoint to
    ``flushed_offset`` (as if the crash came before the last checkpoint) or
    removes it.
    """
    (data_dir / ABORT_MARKER_FILE).touch()
    if remove_checkpoint:
        (data_dir / CHECKPOINT_FILE).unlink()
    elif flushed_offset is not None:
        write_checkpoint(data_dir, Checkpoint(flushed_offset, flushed_offset, 0, {}))
