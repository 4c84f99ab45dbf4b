"""A replica's reads stop at the group's committed point (``read_committed``), on a real store.

Records past the point may be cut by the next master, so a read never returns
them, a queue's ``max_offset`` ends before the first of them, and a filtered
read never moves ``next_offset`` past them (what replaces them must not be
skipped).
"""

from __future__ import annotations

from pathlib import Path

from halfmoon.broker.filter_spec import FilterCache, FilterSpec
from halfmoon.cluster.internal.replica_reads import read_committed
from halfmoon.store.api import GetStatus
from tests.store.storeutil import message, open_store

ALL = FilterSpec("TAG", "*")


def test_reads_stop_at_the_committed_point(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    try:
        tags = ["a", "b"] * 5
        results = [store.put([message(i, TAGS=t)])[0] for i, t in enumerate(tags)]
        store.wait_durable(results[-1].commit_log_offset + results[-1].size)
        # Committed: the first six records (and a part of the seventh, which does not count).
        committed = results[6].commit_log_offset + 10
        filters = FilterCache()
        got = read_committed(store, committed, filters, "orders", 0, 0, 100, 1 << 20, ALL)
        assert [m.queue_offset for m in got.messages] == list(range(6))
        assert (got.next_offset, got.max_offset) == (6, 6)
        assert store.max_offset("orders", 0) == 10  # the store itself holds all ten

        # Only "b" from offset 5: offset 5 matches; 6 to 9 lie past the point, unscanned.
        only_b = read_committed(
            store, committed, filters, "orders", 0, 5, 100, 1 << 20, FilterSpec("TAG", "b")
        )
        assert [m.queue_offset for m in only_b.messages] == [5]
        assert only_b.next_offset == 6
        at_end = read_committed(store, committed, filters, "orders", 0, 6, 100, 1 << 20, ALL)
        assert (at_end.status, at_end.messages, at_end.next_offset) == (
            GetStatus.NO_MESSAGE, [], 6,
        )  # fmt: skip
        # An end offset inside the committed part bounds the read as on a master.
        bounded = read_committed(store, committed, filters, "orders", 0, 0, 100, 1 << 20, ALL, 3)
        assert [m.queue_offset for m in bounded.messages] == [0, 1, 2]
        # Nothing committed: nothing read.
        nothing = read_committed(store, 0, filters, "orders", 0, 0, 100, 1 << 20, ALL)
        assert (nothing.messages, nothing.max_offset) == ([], 0)
    finally:
        store.close()
