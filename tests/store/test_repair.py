"""Lenient repair on real segment files: the dropped bytes survive in a ``.broken`` file."""

from __future__ import annotations

import os

import pytest

from halfmoon.store import Message, record
from halfmoon.store.commitlog import CommitLog
from halfmoon.store.repair import copy_aside, repair

SEGMENT = 64 * 1024


def _log_bytes(log: CommitLog, start: int, end: int) -> bytes:
    """What the segment files hold at commit-log offsets [start, end)."""
    out = bytearray()
    for segment in log.segments:
        a, b = max(start, segment.start), min(end, segment.end)
        if a < b:
            with open(segment.path, "rb") as f:
                f.seek(a - segment.start)
                out += f.read(b - a)
    return bytes(out)


def _append(log: CommitLog, body: bytes, queue_offset: int) -> int:
    buffer = record.encode_unsealed(Message(topic="t", body=body))
    return log.write_record(buffer, queue_offset, 1_700_000_000_000)


@pytest.fixture
def log(tmp_path):
    log = CommitLog(tmp_path / "commitlog", SEGMENT)
    yield log
    log.close()


def test_copy_is_exactly_the_region(log):
    offsets = [_append(log, bytes([i]) * 500, i) for i in range(10)]
    start, end = offsets[3] + 17, offsets[6] + 5  # need not be record boundaries
    copy = copy_aside(log, start, end)
    assert copy == log.directory / f"{start:020d}.broken"
    assert copy.read_bytes() == _log_bytes(log, start, end)


def test_copy_spans_segments_and_keeps_holes(log):
    first = _append(log, b"a" * 1000, 0)
    while log.write_position + 2000 < SEGMENT:
        _append(log, b"b" * 1000, 1)
    last_of_segment = _append(log, b"c" * 1000, 2)
    # Too big for what is left: the writer closes the segment with a filler.
    next_segment = _append(log, b"d" * 1500, 3)
    assert next_segment == SEGMENT and len(log.segments) == 2
    start, end = last_of_segment, next_segment + 100
    copy = copy_aside(log, start, end)
    assert copy.stat().st_size == end - start
    assert copy.read_bytes() == _log_bytes(log, start, end)
    # A sparse copy costs no more blocks than the data it holds plus a page or two.
    segment_blocks = os.stat(log.segments[0].path).st_blocks * 512
    if segment_blocks < SEGMENT:  # the file system keeps holes
        assert os.stat(copy).st_blocks * 512 <= (end - start) + 2 * 4096
    assert first == 0


def test_repair_copies_before_blanking(log, monkeypatch):
    offsets = [_append(log, b"x" * 300, i) for i in range(5)]
    start, end = offsets[2], offsets[3]
    original = _log_bytes(log, start, end)

    def crash(*_args: object) -> None:
        raise OSError("crashed while blanking")

    monkeypatch.setattr(log, "blank_out", crash)
    with pytest.raises(OSError, match="blanking"):
        repair(log, start, end)
    assert (log.directory / f"{start:020d}.broken").read_bytes() == original
    assert _log_bytes(log, start, end) == original  # nothing blanked yet


def test_repair_blanks_the_region(log):
    offsets = [_append(log, b"x" * 300, i) for i in range(5)]
    start, end = offsets[1], offsets[3]
    original = _log_bytes(log, start, end)
    copy = repair(log, start, end)
    assert copy.read_bytes() == original
    assert _log_bytes(log, start, end) == record.blank(end - start)
    assert [m.queue_offset for m in log.records(0)] == [0, 3, 4]


def test_repeated_repair_keeps_one_copy_of_the_same_bytes(log):
    offsets = [_append(log, b"y" * 300, i) for i in range(4)]
    start, end = offsets[1], offsets[2]
    first = copy_aside(log, start, end)
    again = copy_aside(log, start, end)  # a crash before blanking repeats the repair
    assert again == first
    assert sorted(p.name for p in log.directory.glob("*.broken*")) == [first.name]


def test_different_bytes_at_the_same_offset_never_overwrite_a_copy(log):
    offsets = [_append(log, b"z" * 300, i) for i in range(4)]
    start, end = offsets[1], offsets[2]
    first = copy_aside(log, start, end)
    kept = first.read_bytes()
    log.segments[0].mm[start + 200] ^= 0xFF
    second = copy_aside(log, start, end)
    assert second == log.directory / f"{start:020d}.1.broken"
    assert first.read_bytes() == kept
    assert second.read_bytes() == _log_bytes(log, start, end) != kept


def test_broken_files_are_not_taken_for_segments(tmp_path):
    log = CommitLog(tmp_path / "commitlog", SEGMENT)
    offsets = [_append(log, b"w" * 300, i) for i in range(3)]
    repair(log, offsets[1], offsets[2])
    end = log.write_position
    log.sync()
    log.close()
    reopened = CommitLog(tmp_path / "commitlog", SEGMENT)
    try:
        assert [s.path.name for s in reopened.segments] == [f"{0:020d}"]
        reopened.write_position = end
        assert [m.queue_offset for m in reopened.records(0)] == [0, 2]
    finally:
        reopened.close()
