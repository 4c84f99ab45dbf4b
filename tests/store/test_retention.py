import pytest

from halfmoon.store import GetStatus, MessageNotFound
from tests.store.storeutil import SEGMENT, message, open_store

T0 = 1_700_000_000.0
HOUR = 3600.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _fill_segments(store, count=200):
    return [store.append([message(i, size=1000)])[0] for i in range(count)]


def test_segments_older_than_retention_are_deleted_oldest_first(tmp_path):
    clock = Clock(T0)
    with open_store(tmp_path, store_kwargs={"clock": clock}) as store:
        old = _fill_segments(store, 120)
        clock.now = T0 + 50 * HOUR
        new = _fill_segments(store, 60)
        assert store.run_retention(T0 + 60 * HOUR) == 0
        deleted = store.run_retention(T0 + 73 * HOUR)
        assert deleted >= 1
        assert store.stats().commit_log_min_offset <= new[0].commit_log_offset
        assert store.stats().commit_log_min_offset > old[0].commit_log_offset
        assert store.run_retention(T0 + 200 * HOUR) >= 1
        assert store.stats().segments == 1  # never the segment being written


def test_reads_below_retained_minimum_say_offset_moved(tmp_path):
    clock = Clock(T0)
    with open_store(tmp_path, store_kwargs={"clock": clock}) as store:
        results = _fill_segments(store)
        store.run_retention(T0 + 100 * HOUR)
        minimum = store.min_offset("orders", 0)
        assert minimum > 0
        got = store.get("orders", 0, 0)
        assert got.status is GetStatus.OFFSET_TOO_SMALL and got.next_offset == minimum
        assert store.get("orders", 0, minimum).messages[0].queue_offset == minimum
        with pytest.raises(MessageNotFound) as info:
            store.read_at(results[0].commit_log_offset)
        assert info.value.code == "MESSAGE_NOT_FOUND"
    with open_store(tmp_path) as store:  # the minimum survives a restart
        assert store.min_offset("orders", 0) == minimum


def test_disk_usage_above_ratio_deletes_until_one_segment(tmp_path):
    usage = {"ratio": 0.5}
    with open_store(tmp_path, store_kwargs={"disk_usage": lambda: usage["ratio"]}) as store:
        _fill_segments(store)
        segments = store.stats().segments
        assert store.run_retention(T0) == 0 and segments > 2
        usage["ratio"] = 0.9
        assert store.run_retention(T0) == segments - 1
        assert (
            store.stats().commit_log_min_offset
            == store.stats().commit_log_max_offset // SEGMENT * SEGMENT
        )
        assert store.put([message(999)])[0].queue_offset == 200
