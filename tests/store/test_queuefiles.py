"""The map cache on real files: bounded mappings, second chance, no lost writes on eviction."""

from __future__ import annotations

from pathlib import Path

from halfmoon.store.queuefiles import MapCache, Queue, QueueFile
from halfmoon.store.queueformat import ENTRY, ENTRY_SIZE, file_name


def _files(directory: Path, count: int, capacity: int = 4) -> list[QueueFile]:
    files = []
    for i in range(count):
        path = directory / file_name(i * capacity)
        path.write_bytes(bytes(capacity * ENTRY_SIZE))
        files.append(QueueFile(path, i * capacity, capacity))
    return files


def test_at_most_limit_files_are_mapped(tmp_path: Path) -> None:
    cache = MapCache(2)
    files = _files(tmp_path, 5)
    for f in files:
        cache.get(f)
        assert cache.open_count() <= 2
    assert sum(f.mm is not None for f in files) == 2


def test_a_referenced_file_gets_a_second_chance(tmp_path: Path) -> None:
    cache = MapCache(2)
    a, b, c = _files(tmp_path, 3)
    cache.get(a)
    cache.get(b)
    cache.get(a)  # a hit: a is referenced, b is not
    cache.get(c)
    assert a.mm is not None and b.mm is None and c.mm is not None


def test_evicting_a_dirty_file_keeps_its_writes(tmp_path: Path) -> None:
    cache = MapCache(1)
    a, b = _files(tmp_path, 2)
    ENTRY.pack_into(cache.get(a), 0, 4096, 120, 7)
    a.dirty = True
    cache.get(b)  # evicts a, which must be written back first
    assert a.mm is None and not a.dirty
    assert ENTRY.unpack_from(a.path.read_bytes(), 0) == (4096, 120, 7)


def test_forget_unmaps_and_deletes(tmp_path: Path) -> None:
    cache = MapCache(4)
    [a] = _files(tmp_path, 1)
    cache.get(a)
    a.dirty = True
    cache.forget(a)
    assert a.mm is None and not a.dirty and not a.path.exists()
    assert cache.open_count() == 0


def test_queue_finds_the_file_of_an_offset(tmp_path: Path) -> None:
    queue = Queue("t", 0, tmp_path)
    queue.files = _files(tmp_path, 3)
    assert queue.file_for(0) is queue.files[0]
    assert queue.file_for(5) is queue.files[1]
    assert queue.file_for(11) is queue.files[2]
    assert queue.file_for(12) is None
