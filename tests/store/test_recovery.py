import logging
import shutil

import pytest

from halfmoon.errors import CorruptionError
from halfmoon.store import GetStatus, record
from halfmoon.store.checkpoint import CHECKPOINT_FILE
from tests.store.corrupt import (
    flip_byte,
    flip_log_byte,
    segment_of,
    simulate_crash,
    truncate,
    zero_log_range,
)
from tests.store.storeutil import Reporter, message, open_store


def _write(tmp_path, count=20, **overrides):
    with open_store(tmp_path, **overrides) as store:
        return [store.append([message(i)])[0] for i in range(count)]


def test_clean_shutdown_scans_nothing(tmp_path):
    _write(tmp_path)
    with open_store(tmp_path) as store:
        assert not store.recovery.crashed and store.recovery.bytes_scanned == 0
        assert store.max_offset("orders", 0) == 20


def test_recovery_scans_only_the_unflushed_tail(tmp_path):
    results = _write(tmp_path)
    simulate_crash(tmp_path, flushed_offset=results[15].commit_log_offset)
    with open_store(tmp_path) as store:
        assert store.recovery.crashed
        assert store.recovery.bytes_scanned == sum(r.size for r in results[15:])
        assert store.max_offset("orders", 0) == 20


def test_torn_tail_is_cut_quietly(tmp_path):
    results = _write(tmp_path)
    last = results[-1]
    zero_log_range(tmp_path, last.commit_log_offset + 40, last.size - 40)
    simulate_crash(tmp_path, flushed_offset=results[10].commit_log_offset)
    reporter = Reporter()
    with open_store(tmp_path, store_kwargs={"reporter": reporter}) as store:
        assert reporter.reports == []
        assert store.recovery.end == last.commit_log_offset
        assert store.max_offset("orders", 0) == 19
        again = store.put([message(99)])[0]
        assert (again.queue_offset, again.commit_log_offset) == (19, last.commit_log_offset)
        assert store.get("orders", 0, 19).messages[0].unique_id == "id-orders-99"


def test_torn_tail_header_only(tmp_path):
    results = _write(tmp_path)
    zero_log_range(tmp_path, results[-1].commit_log_offset + 8, results[-1].size - 8)
    simulate_crash(tmp_path, remove_checkpoint=True)
    with open_store(tmp_path) as store:
        assert store.recovery.damaged == [] and store.max_offset("orders", 0) == 19


def test_bad_crc_mid_file_strict_raises_and_reports(tmp_path):
    results = _write(tmp_path)
    flip_log_byte(tmp_path, results[5].commit_log_offset + 100)
    simulate_crash(tmp_path, remove_checkpoint=True)
    reporter = Reporter()
    with pytest.raises(CorruptionError, match="offset"):
        open_store(tmp_path, store_kwargs={"reporter": reporter})
    assert reporter.reports == [(results[5].commit_log_offset, results[5].size, "bad_crc")]
    # the marker stays: a lenient open can still recover
    with open_store(tmp_path, recovery="lenient") as store:
        assert store.recovery.damaged == [(results[5].commit_log_offset, results[5].size)]


def test_bad_crc_mid_file_lenient_skips_to_next_record(tmp_path):
    results = _write(tmp_path)
    flip_log_byte(tmp_path, results[5].commit_log_offset + 100)
    simulate_crash(tmp_path, flushed_offset=results[2].commit_log_offset)
    reporter = Reporter()
    with open_store(tmp_path, recovery="lenient", store_kwargs={"reporter": reporter}) as store:
        assert reporter.reports == [(results[5].commit_log_offset, results[5].size, "bad_crc")]
        got = store.get("orders", 0, 0, 100)
        ids = [m.queue_offset for m in got.messages]
        assert ids == [i for i in range(20) if i != 5]  # never the damaged one
        assert got.next_offset == 20


def test_bad_length_mid_file_is_reported(tmp_path):
    results = _write(tmp_path)
    flip_log_byte(tmp_path, results[7].commit_log_offset + 1, 0x40)  # total_size
    simulate_crash(tmp_path, remove_checkpoint=True)
    reporter = Reporter()
    with open_store(tmp_path, recovery="lenient", store_kwargs={"reporter": reporter}) as store:
        assert reporter.reports[0][:2] == (results[7].commit_log_offset, results[7].size)
        assert store.max_offset("orders", 0) == 20


def test_corrupt_checkpoint_is_ignored_with_full_recovery(tmp_path, caplog):
    _write(tmp_path)
    flip_byte(tmp_path / CHECKPOINT_FILE, 10)
    simulate_crash(tmp_path)
    with open_store(tmp_path) as store:
        assert store.recovery.checkpoint == "corrupt" and store.recovery.scan_start == 0
        assert store.max_offset("orders", 0) == 20
        assert store.query_by_key("orders", "key-3")[0].queue_offset == 3
    assert "checkpoint_ignored" in caplog.text


def test_truncated_consume_queue_is_rebuilt(tmp_path):
    _write(tmp_path, count=150)  # 64 entries per queue file
    files = sorted((tmp_path / "consumequeue" / "orders" / "0").iterdir())
    truncate(files[0], 30 * 20 + 7)
    with open_store(tmp_path) as store:
        assert store.recovery.rebuilt_queues == [("orders", 0)]
        got = store.get("orders", 0, 0, 200)
        assert [m.queue_offset for m in got.messages] == list(range(150))


def test_missing_consume_queue_is_rebuilt(tmp_path):
    _write(tmp_path, count=30)
    shutil.rmtree(tmp_path / "consumequeue" / "orders")
    with open_store(tmp_path) as store:
        assert store.max_offset("orders", 0) == 30
        assert store.put([message(30)])[0].queue_offset == 30


def test_missing_index_is_rebuilt(tmp_path):
    _write(tmp_path, count=30)
    shutil.rmtree(tmp_path / "index")
    with open_store(tmp_path) as store:
        assert store.recovery.index_rebuilt
        [found] = store.query_by_key("orders", "key-17")
        assert found.queue_offset == 17
        assert store.query_by_key("orders", "id-orders-4")[0].queue_offset == 4


def test_crash_redispatches_queue_entries_from_checkpoint(tmp_path):
    results = _write(tmp_path)
    simulate_crash(tmp_path, flushed_offset=results[0].commit_log_offset)
    with open_store(tmp_path) as store:
        assert store.recovery.redispatched_from == results[0].commit_log_offset
        assert store.get("orders", 0, 0, 50).status is GetStatus.FOUND
        assert len(store.get("orders", 0, 0, 50).messages) == 20


def test_garbage_after_recovered_end_is_zeroed(tmp_path):
    results = _write(tmp_path)
    last = results[-1]
    flip_log_byte(tmp_path, last.commit_log_offset + 90)
    simulate_crash(tmp_path, remove_checkpoint=True)
    with open_store(tmp_path) as store:
        assert store.recovery.end == last.commit_log_offset
        small = store.put([message(50, size=10)])[0]
    simulate_crash(tmp_path, remove_checkpoint=True)
    with open_store(tmp_path) as store:  # the old torn record must not resurface
        assert store.recovery.end == small.end_offset
        assert store.read_at(small.commit_log_offset).unique_id == "id-orders-50"
        assert small.size > record.MIN_RECORD_SIZE


def _broken_files(data_dir):
    return sorted((data_dir / "commitlog").glob("*.broken"))


def test_lenient_repair_copies_the_dropped_bytes_aside(tmp_path, caplog):
    results = _write(tmp_path)
    damaged = results[5]
    flip_log_byte(tmp_path, damaged.commit_log_offset + 100)
    path, position = segment_of(tmp_path, damaged.commit_log_offset)
    dropped = path.read_bytes()[position : position + damaged.size]
    simulate_crash(tmp_path, remove_checkpoint=True)
    reporter = Reporter()
    with (
        caplog.at_level(logging.INFO, logger="halfmoon.store"),
        open_store(tmp_path, recovery="lenient", store_kwargs={"reporter": reporter}) as store,
    ):
        copy = tmp_path / "commitlog" / f"{damaged.commit_log_offset:020d}.broken"
        assert store.recovery.broken_copies == [copy]
        assert copy.read_bytes() == dropped  # exactly the dropped bytes, damage included
        # Recovery itself is unchanged: the same report, the same messages served.
        assert reporter.reports == [(damaged.commit_log_offset, damaged.size, "bad_crc")]
        assert store.recovery.damaged == [(damaged.commit_log_offset, damaged.size)]
        got = store.get("orders", 0, 0, 100)
        assert [m.queue_offset for m in got.messages] == [i for i in range(20) if i != 5]
    # The region is blanked in the log itself, and the log lines say where the copy is.
    blanked = path.read_bytes()[position : position + damaged.size]
    assert blanked[:8] == record.FRAME.pack(damaged.size, record.BLANK_MAGIC)
    assert f"copy={copy}" in caplog.text
    recovery_line = next(r.message for r in caplog.records if "event=recovery " in r.message)
    assert f"broken_copies={copy}" in recovery_line
    with open_store(tmp_path) as store:  # a clean reopen: nothing more to repair
        assert store.recovery.broken_copies == []
    assert _broken_files(tmp_path) == [copy]


def test_strict_recovery_copies_nothing(tmp_path):
    results = _write(tmp_path)
    flip_log_byte(tmp_path, results[5].commit_log_offset + 100)
    simulate_crash(tmp_path, remove_checkpoint=True)
    with pytest.raises(CorruptionError):
        open_store(tmp_path)
    assert _broken_files(tmp_path) == []


def test_torn_tail_is_not_copied_aside(tmp_path):
    results = _write(tmp_path)
    flip_log_byte(tmp_path, results[-1].commit_log_offset + 90)
    simulate_crash(tmp_path, remove_checkpoint=True)
    with open_store(tmp_path, recovery="lenient") as store:
        assert store.recovery.end == results[-1].commit_log_offset
        assert store.recovery.broken_copies == []
    assert _broken_files(tmp_path) == []
