"""Cutting the log back to an offset, crash-safely: the intent marker and its completion.

A replica whose log diverged from its master's (a deposed master's
unreplicated tail) cuts everything from offset T on: the commit log and what
is derived from it (consume-queue entries, key-index entries). The cut is
several writes in several files, so it is made restartable:

1. the **intent** ``<data_dir>/truncate`` (holding T) is written atomically
   and durably first;
2. then the log is cut at T and the consume queues and key index drop every
   entry at or after T, and a checkpoint at T is written;
3. then the intent is removed.

Opening a store that finds the intent (a crash, e.g. SIGKILL, anywhere
between 1 and 3) cuts the log at T again *before* recovery runs, and
recovers as after a crash from a checkpoint capped at T
(:func:`capped`). Recovery itself drops the queue and index entries at or
after the log's end, so whatever step 2 had or had not done, the store
opens cut at T. Each step is idempotent; no step can resurrect the tail,
because the tail's records are gone from the log before anything relies on
the derived state being cut, and recovery never scans past T while the
intent is there.

The checkpoint is capped (flushed and dispatched offsets at most T) because
an uncapped one could point recovery past T: scanning from there finds
zeros and would set the log's end beyond T. Its per-queue maxima are
dropped, since they may count truncated entries (recovery would take the
queues for damaged and rebuild them from the whole log: correct, but slow).

Crash tests stop a truncation midway at the store's failpoints
(:mod:`halfmoon.failpoints`): ``truncate-after-log`` in step 2,
``truncate-before-clear`` between 2 and 3.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from halfmoon.errors import CorruptionError, StorageError
from halfmoon.store.checkpoint import Checkpoint
from halfmoon.store.fsutil import fsync_directory, replace_atomically

INTENT_FILE = "truncate"


class TruncationRefused(StorageError):
    """The log cannot be cut where asked (below its retained start)."""

    code = "TRUNCATION_REFUSED"
    protocol_code = "INTERNAL_ERROR"


def write_intent(data_dir: Path, offset: int) -> None:
    replace_atomically(data_dir / INTENT_FILE, f"{offset}\n".encode())


def read_intent(data_dir: Path) -> int | None:
    """The offset an unfinished truncation cuts at, or None."""
    path = data_dir / INTENT_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        offset = int(text.strip())
    except ValueError:
        raise CorruptionError(
            f"{path}: expected the offset of an unfinished truncation, found {text!r}"
        ) from None
    if offset < 0:
        raise CorruptionError(f"{path}: a negative truncation offset {offset}")
    return offset


def clear_intent(data_dir: Path) -> None:
    (data_dir / INTENT_FILE).unlink(missing_ok=True)
    fsync_directory(data_dir)


def capped(checkpoint: Checkpoint | None, offset: int) -> Checkpoint | None:
    """The checkpoint as recovery may trust it once the log is cut at ``offset``."""
    if checkpoint is None:
        return None
    return replace(
        checkpoint,
        flushed_offset=min(checkpoint.flushed_offset, offset),
        dispatched_offset=min(checkpoint.dispatched_offset, offset),
        queue_offsets={},
    )
