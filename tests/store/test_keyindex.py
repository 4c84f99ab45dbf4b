"""The key index on real files: queries, files rolling over, recovery, damage on open."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from halfmoon.store.keyindex import ENTRY_SIZE, HEADER_SIZE, KeyIndex

FOREVER = (0, 2**62)

# -- damage helpers ---------------------------------------------------------


def index_file(root: Path, sequence: int) -> Path:
    return root / f"{sequence:020d}.idx"


def write_at(path: Path, position: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(position)
        fh.write(data)


def entry_position(slots: int, number: int) -> int:
    return HEADER_SIZE + slots * 4 + number * ENTRY_SIZE


def fill(index: KeyIndex, count: int, keys: int = 3, start: int = 0) -> None:
    """Message i: key ``k{i % keys}``, offset 100*i, stored at 1000 + 10*i ms."""
    for i in range(start, start + count):
        index.put("t", f"k{i % keys}", 100 * i, 1_000 + 10 * i)


def offsets_of(key_number: int, count: int, keys: int = 3) -> list[int]:
    """What a query for ``k{key_number}`` must return after ``fill(count)``: newest first."""
    return [100 * i for i in reversed(range(count)) if i % keys == key_number]


def crash_after_writing(root: Path, slots: int, max_entries: int, count: int) -> None:
    """Fill an index in a child process, flush it, and SIGKILL the child (no close)."""
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from halfmoon.store.keyindex import KeyIndex
        index = KeyIndex(Path({str(root)!r}), slots={slots}, max_entries={max_entries})
        for i in range({count}):
            index.put("t", f"k{{i % 3}}", 100 * i, 1_000 + 10 * i)
        index.flush()
        print("ready", flush=True)
        sys.stdin.read()
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert child.stdout is not None
    assert child.stdout.readline() == b"ready\n"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)


@pytest.fixture
def index(tmp_path: Path):
    key_index = KeyIndex(tmp_path / "index", slots=7, max_entries=5)
    yield key_index
    key_index.close()


# -- queries ----------------------------------------------------------------


def test_round_trip(index: KeyIndex) -> None:
    fill(index, 4)
    assert index.query("t", "k0", *FOREVER, 10) == [300, 0]
    assert index.query("t", "k1", *FOREVER, 10) == [100]
    assert index.query("t", "nope", *FOREVER, 10) == []
    assert index.query("other", "k0", *FOREVER, 10) == []  # the topic is part of the key
    assert index.max_commit_log_offset() == 300


def test_empty_index(index: KeyIndex) -> None:
    assert index.query("t", "k0", *FOREVER, 10) == []
    assert index.max_commit_log_offset() == -1


def test_query_time_range(index: KeyIndex) -> None:
    fill(index, 4, keys=1)  # stored at 1000, 1010, 1020, 1030
    assert index.query("t", "k0", 1_010, 1_020, 10) == [200, 100]
    assert index.query("t", "k0", 1_011, 1_019, 10) == []
    assert index.query("t", "k0", 1_030, 5_000, 10) == [300]
    assert index.query("t", "k0", 2_000, 1_000, 10) == []


def test_query_spans_multiple_files_newest_first(index: KeyIndex) -> None:
    fill(index, 23)
    assert len(list(index.root.glob("*.idx"))) == 5
    for key in range(3):
        assert index.query("t", f"k{key}", *FOREVER, 100) == offsets_of(key, 23)
    assert index.query("t", "k1", *FOREVER, 3) == offsets_of(1, 23)[:3]
    assert index.query("t", "k1", 1_000, 1_060, 100) == [400, 100]  # skips newer files


def test_collisions_with_one_slot(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slots=1, max_entries=50)
    fill(index, 30, keys=5)
    for key in range(5):
        assert index.query("t", f"k{key}", *FOREVER, 100) == offsets_of(key, 30, keys=5)
    index.close()


def test_duplicates_are_returned_once(index: KeyIndex) -> None:
    index.put("t", "order-1", 100, 1_000)
    index.put("t", "order-1", 100, 1_000)  # a message listing the same key twice
    index.put("t", "order-1", 200, 1_001)
    index.put("t", "order-1", 200, 1_001)
    assert index.query("t", "order-1", *FOREVER, 10) == [200, 100]


def test_put_below_highest_offset_is_ignored(index: KeyIndex) -> None:
    fill(index, 4)
    fill(index, 4)  # recovery re-dispatches from an older checkpoint
    assert index.query("t", "k0", *FOREVER, 10) == [300, 0]
    index.put("t", "k9", 300, 1_030)  # another key of the newest message is still welcome
    assert index.query("t", "k9", *FOREVER, 10) == [300]


def test_clock_going_back_is_recorded_at_file_begin(index: KeyIndex) -> None:
    index.put("t", "a", 100, 5_000)
    index.put("t", "a", 200, 4_000)
    assert index.query("t", "a", 5_000, 5_000, 10) == [200, 100]


def test_timestamp_beyond_delta_range_starts_new_file(index: KeyIndex) -> None:
    index.put("t", "a", 100, 0)
    index.put("t", "a", 200, 2**33)
    assert len(list(index.root.glob("*.idx"))) == 2
    assert index.query("t", "a", 2**33, 2**33, 10) == [200]


# -- recovery and retention -------------------------------------------------


def test_truncate_from_within_newest_file(index: KeyIndex) -> None:
    fill(index, 8)  # files: entries 0..4, 5..7
    index.truncate_from(650)
    assert index.max_commit_log_offset() == 600
    assert index.query("t", "k1", *FOREVER, 10) == [400, 100]
    assert index.query("t", "k0", *FOREVER, 10) == [600, 300, 0]
    fill(index, 3, start=7)  # re-dispatch; slots must chain onto what was kept
    for key in range(3):
        assert index.query("t", f"k{key}", *FOREVER, 100) == offsets_of(key, 10)


def test_truncate_from_drops_whole_newest_files(index: KeyIndex) -> None:
    fill(index, 12)
    index.truncate_from(400)
    assert len(list(index.root.glob("*.idx"))) == 1
    assert index.max_commit_log_offset() == 300
    fill(index, 12, start=4)
    for key in range(3):
        assert index.query("t", f"k{key}", *FOREVER, 100) == offsets_of(key, 16)
    index.truncate_from(0)
    assert index.max_commit_log_offset() == -1
    assert list(index.root.glob("*.idx")) == []


def test_truncate_survives_reopen(index: KeyIndex) -> None:
    fill(index, 8)
    index.truncate_from(650)
    index.close()
    index = KeyIndex(index.root, slots=7, max_entries=5)
    assert index.query("t", "k0", *FOREVER, 10) == [600, 300, 0]
    assert index.max_commit_log_offset() == 600
    index.close()


def test_trim_below_deletes_old_files_keeps_newest(index: KeyIndex) -> None:
    fill(index, 12)  # files end at offsets 400, 900, 1100
    index.trim_below(850)
    assert sorted(p.name for p in index.root.glob("*.idx")) == [
        "00000000000000000001.idx",
        "00000000000000000002.idx",
    ]
    assert index.query("t", "k0", *FOREVER, 10) == [900]  # trimmed offsets never return
    index.trim_below(5_000)
    assert len(list(index.root.glob("*.idx"))) == 1
    assert index.max_commit_log_offset() == 1_100


def test_reset_deletes_everything(index: KeyIndex) -> None:
    fill(index, 12)
    index.reset()
    assert list(index.root.glob("*.idx")) == []
    assert index.query("t", "k0", *FOREVER, 10) == []
    fill(index, 2)
    assert index.query("t", "k0", *FOREVER, 10) == [0]


def test_reopen_after_close(index: KeyIndex) -> None:
    fill(index, 13)
    index.close()
    index = KeyIndex(index.root, slots=7, max_entries=5)
    for key in range(3):
        assert index.query("t", f"k{key}", *FOREVER, 100) == offsets_of(key, 13)
    fill(index, 4, start=13)
    for key in range(3):
        assert index.query("t", f"k{key}", *FOREVER, 100) == offsets_of(key, 17)
    index.close()


def test_open_maps_stay_bounded(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, slots=3, max_entries=2, max_open_files=3)
    fill(index, 40)
    assert index.open_file_count() == 1
    assert index.query("t", "k0", *FOREVER, 100) == offsets_of(0, 40)
    assert index.open_file_count() <= 3
    index.close()


# -- damage found on open ---------------------------------------------------


def test_missing_index_directory(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path / "no" / "such" / "dir")
    assert index.query("t", "k", *FOREVER, 10) == []
    assert index.max_commit_log_offset() == -1
    index.put("t", "k", 5, 1_000)
    assert index.query("t", "k", *FOREVER, 10) == [5]
    index.close()


def test_unclean_shutdown_keeps_flushed_entries(tmp_path: Path, caplog) -> None:
    crash_after_writing(tmp_path, slots=7, max_entries=5, count=13)
    with caplog.at_level(logging.WARNING, logger="halfmoon.store"):
        index = KeyIndex(tmp_path, slots=7, max_entries=5)
    assert "not closed cleanly" in caplog.text
    for key in range(3):
        assert index.query("t", f"k{key}", *FOREVER, 100) == offsets_of(key, 13)
    index.close()


def test_torn_entries_after_crash_are_cut_and_slots_rebuilt(tmp_path: Path) -> None:
    crash_after_writing(tmp_path, slots=7, max_entries=50, count=10)
    # Entry 6 never reached the disk; 7..9 did (pages are written in any order).
    write_at(index_file(tmp_path, 0), entry_position(7, 6), bytes(ENTRY_SIZE))
    index = KeyIndex(tmp_path, slots=7, max_entries=50)
    assert index.max_commit_log_offset() == 500
    for key in range(3):
        assert index.query("t", f"k{key}", *FOREVER, 100) == offsets_of(key, 6)
    fill(index, 4, start=6)  # recovery re-dispatches the rest
    for key in range(3):
        assert index.query("t", f"k{key}", *FOREVER, 100) == offsets_of(key, 10)
    index.close()


def test_truncated_index_file_is_repaired(index: KeyIndex, caplog) -> None:
    fill(index, 4)
    index.close()
    path = index_file(index.root, 0)
    os.truncate(path, entry_position(7, 2) + 3)  # entries 2 and 3 are gone
    with caplog.at_level(logging.WARNING, logger="halfmoon.store"):
        index = KeyIndex(index.root, slots=7, max_entries=5)
    assert "resizing" in caplog.text
    assert index.max_commit_log_offset() == 100
    assert index.query("t", "k0", *FOREVER, 10) == [0]
    assert os.path.getsize(path) == entry_position(7, 5)
    index.close()


def test_file_with_bad_header_is_deleted(index: KeyIndex, caplog) -> None:
    fill(index, 8)
    index.close()
    write_at(index_file(index.root, 0), 0, b"JUNK")
    with caplog.at_level(logging.WARNING, logger="halfmoon.store"):
        index = KeyIndex(index.root, slots=7, max_entries=5)
    assert "no valid header" in caplog.text
    assert not index_file(index.root, 0).exists()
    assert index.query("t", "k0", *FOREVER, 10) == [600]  # the newer file still answers
    index.close()


def test_tiny_file_is_deleted(index: KeyIndex) -> None:
    index.root.mkdir(parents=True)
    index_file(index.root, 0).write_bytes(b"\x00" * 10)
    index.close()
    index = KeyIndex(index.root, slots=7, max_entries=5)
    assert index.max_commit_log_offset() == -1
    assert not index_file(index.root, 0).exists()
    index.close()


def test_garbage_names_are_ignored(index: KeyIndex, caplog) -> None:
    fill(index, 3)
    index.close()
    (index.root / "README").write_text("hello")
    (index.root / "12.idx").write_bytes(b"x" * 100)
    with caplog.at_level(logging.WARNING, logger="halfmoon.store"):
        index = KeyIndex(index.root, slots=7, max_entries=5)
    assert "ignoring" in caplog.text
    assert index.query("t", "k0", *FOREVER, 10) == [0]
    assert (index.root / "README").exists()
    index.close()


def test_slot_pointing_past_entry_count_is_not_followed(index: KeyIndex) -> None:
    fill(index, 3)
    index.close()
    path = index_file(index.root, 0)
    for slot in range(7):  # every slot claims entry number 200 (past the file)
        write_at(path, HEADER_SIZE + slot * 4, (200).to_bytes(4, "big"))
    index = KeyIndex(index.root, slots=7, max_entries=5)
    assert index.query("t", "k0", *FOREVER, 10) == []  # nothing invented, no crash
    index.close()
