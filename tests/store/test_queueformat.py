"""The consume-queue entry format: the worked example of docs/storage-format.md."""

from __future__ import annotations

import dataclasses

import pytest

from halfmoon.store.message import tag_hash
from halfmoon.store.queueformat import (
    ENTRY,
    ENTRY_SIZE,
    SIZE_AT,
    TRIMMED_MARKER,
    TRIMMED_SIZE,
    QueueEntry,
    file_name,
    make_entry,
)


def test_documented_entry_bytes():
    raw = ENTRY.pack(4096, 120, tag_hash("new"))
    assert ENTRY_SIZE == 20
    assert raw.hex(" ") == "00 00 00 00 00 00 10 00 00 00 00 78 77 a4 12 f5 99 08 d2 dc"


def test_trimmed_marker_is_the_size_field():
    raw = bytearray(ENTRY.pack(4096, 120, 7))
    raw[SIZE_AT : SIZE_AT + 4] = TRIMMED_MARKER
    assert ENTRY.unpack(raw) == (4096, TRIMMED_SIZE, 7)


def test_make_entry_equals_the_dataclass():
    entry = make_entry(7, 4096, 120, -5)
    assert entry == QueueEntry(7, 4096, 120, -5)
    assert hash(entry) == hash(QueueEntry(7, 4096, 120, -5))
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.size = 1  # type: ignore[misc]


def test_file_names_sort_by_offset():
    assert file_name(300_000) == "00000000000000300000"
    assert sorted([file_name(10), file_name(9)]) == [file_name(9), file_name(10)]
