"""Helpers shared by the consume-queue tests: fill a queue, damage its files, reopen it."""

from __future__ import annotations

import os
from pathlib import Path

from halfmoon.store.consumequeue import ENTRY_SIZE, ConsumeQueues, QueueEntry


def queue_file(root: Path, topic: str, queue_id: int, start: int) -> Path:
    return root / topic / str(queue_id) / f"{start:020d}"


def truncate_to(path: Path, size: int) -> None:
    os.truncate(path, size)


def write_at(path: Path, position: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(position)
        fh.write(data)


def zero_entries(path: Path, first: int, count: int) -> None:
    write_at(path, first * ENTRY_SIZE, bytes(count * ENTRY_SIZE))


def fill(cq: ConsumeQueues, topic: str, queue_id: int, count: int, start: int = 0) -> None:
    """Entry i points at commit-log offset 100*i + 7 with size 10 + i and tag i."""
    for i in range(start, start + count):
        cq.put(topic, queue_id, i, 100 * i + 7, 10 + i, i)


def expected(first: int, stop: int) -> list[QueueEntry]:
    return [QueueEntry(i, 100 * i + 7, 10 + i, i) for i in range(first, stop)]


def reopen(cq: ConsumeQueues, entries_per_file: int = 4) -> ConsumeQueues:
    cq.close()
    return ConsumeQueues(cq.root, entries_per_file)
