"""What a durable append costs the disk: the pages written, not the page cache's large folios.

Appends fault a segment's pages in one after another; a file system with large folios (XFS;
ext4 since Linux 6.16, this machine's) takes that for a sequential reader and grows the folios
it allocates, up to 2 MiB, so that each fdatasync deep into a segment wrote back 2 MiB for one
message. The store maps every file it appends to with random advice (``MADV_RANDOM``, shown
as ``rr`` in ``/proc/self/smaps``), and gives a segment the default advice back once the log
has rolled past it, and the written part far enough behind the write position as appends go
on: read-ahead serves a reader of what is written.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from halfmoon.store import commitlog
from tests.store.storeutil import message, open_store

SEGMENT = 64 << 20  # room for the read-ahead window to grow to 2 MiB folios
BODY = 15 << 10


def _written_bytes() -> int:
    """Bytes this process has dirtied for the block layer (``/proc/self/io``)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no write_bytes")


def _areas(directory: Path) -> dict[str, list[tuple[int, int, set[str]]]]:
    """Each of this process's mappings of a file under ``directory``: its areas in file
    order, as (file offset, length, VmFlags)."""
    areas: dict[str, list[tuple[int, int, set[str]]]] = {}
    current = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"([0-9a-f]+)-([0-9a-f]+) \S+ ([0-9a-f]+) \S+ \d+\s+(.*)$", line)
        if head:
            low, high, offset, path = head.groups()
            current = path if path.startswith(str(directory)) else None
            span = (int(offset, 16), int(high, 16) - int(low, 16))
        elif current and line.startswith("VmFlags:"):
            areas.setdefault(current, []).append((*span, set(line.split()[1:])))
    return {path: sorted(found, key=lambda area: area[0]) for path, found in areas.items()}


def _advice(directory: Path) -> dict[str, set[str]]:
    """The VmFlags of the last area (the highest file offsets) of each mapped file."""
    return {path: found[-1][2] for path, found in _areas(directory).items()}


def _fill(store, size: int, topic: str = "deep") -> None:
    for start in range(0, size // BODY, 100):
        store.append([message(start + i, topic=topic, size=BODY) for i in range(100)])


def _per_durable_put(store, count: int = 50) -> float:
    before = _written_bytes()
    for i in range(count):
        store.put([message(i, topic="probe", size=1000)])
    return (_written_bytes() - before) / count


def _limits(store) -> None:
    # A durable put dirties its record's page or two, a consume-queue entry's and a key-index
    # entry's; 2 MiB folios made it 2 MiB.
    assert _per_durable_put(store) < 64 << 10


def test_a_durable_append_deep_into_a_segment_writes_back_pages_not_large_folios(tmp_path):
    settings = {"segment_size": SEGMENT, "flush": "sync", "max_body_size": 64 << 10}
    with open_store(tmp_path, **settings) as store:
        _fill(store, 24 << 20)
        _limits(store)
    with open_store(tmp_path, **settings) as store:  # reopened: recovery's resume() advises
        _fill(store, 24 << 20)
        _limits(store)


def test_every_file_appended_to_is_mapped_with_random_advice_and_a_sealed_segment_is_not(
    tmp_path,
):
    settings = {"segment_size": 1 << 20, "max_body_size": 64 << 10}
    with open_store(tmp_path, **settings) as store:
        _fill(store, 3 << 20)  # three segments, the fourth being appended to
        store.put([message(0, topic="t")])
        advice = _advice(tmp_path)
        segments = sorted(p for p in advice if "/commitlog/" in p)
        assert len(segments) >= 4, advice
        assert "rr" in advice[segments[-1]], segments[-1]
        assert all("rr" not in advice[p] for p in segments[:-1]), segments
        queue_files = [p for p in advice if "/consumequeue/" in p]
        index_files = [p for p in advice if "/index/" in p]
        assert queue_files and index_files, advice
        assert all("rr" in advice[p] for p in queue_files + index_files), advice


def test_the_written_part_behind_the_write_position_gets_read_ahead_back(
    tmp_path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(commitlog, "READ_AHEAD_MARGIN", 1 << 20)
    monkeypatch.setattr(commitlog, "READVISE_EVERY", 2 << 20)
    settings = {"segment_size": 16 << 20, "max_body_size": 64 << 10}
    with open_store(tmp_path, **settings) as store:
        _fill(store, 10 << 20)
        (active,) = [p for p in _areas(tmp_path) if "/commitlog/" in p]
        first, *_, last = _areas(tmp_path)[active]
        assert first[0] == 0 and "rr" not in first[2], first  # behind: read-ahead
        assert first[1] >= (10 - 1 - 2) << 20, first  # up to a margin and a step behind
        assert "rr" in last[2] and last[0] + last[1] == 16 << 20, last  # the tail: page faults
