"""Shipping a commit log to a replica: chunks cut on record boundaries, appended byte for byte,
dispatched to consume queues and the key index, bad chunks refused whole."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from halfmoon.store import GetStatus, MessageStore
from halfmoon.store.commitlog import OffsetGone
from halfmoon.store.shipping import ShippedDataError
from tests.store.storeutil import SEGMENT, message, open_store


def ship_all(master: MessageStore, replica: MessageStore, max_bytes: int = 10_000) -> int:
    """Copy everything visible on the master to the replica; the number of chunks."""
    chunks = 0
    while True:
        data = master.read_shipment(replica.end_offset, max_bytes)
        if not data:
            return chunks
        replica.append_replicated(replica.end_offset, data)
        chunks += 1


def log_bytes(data_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((data_dir / "commitlog").iterdir()))


def test_a_shipped_log_is_byte_identical_and_readable_on_the_replica(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as master, open_store(tmp_path / "r") as replica:
        # ~3 segments: rolls (blank fillers) travel too
        master.put([message(i, queue_id=i % 3, size=900) for i in range(200)])
        chunks = ship_all(master, replica)
        assert chunks > 3  # max_bytes cut them
        assert replica.end_offset == master.end_offset > 2 * SEGMENT
        for queue_id in range(3):
            assert replica.max_offset("orders", queue_id) == master.max_offset("orders", queue_id)
        got = replica.get("orders", 1, 0, max_messages=100)
        assert got.status is GetStatus.FOUND
        assert [m.body for m in got.messages] == [
            m.body for m in master.get("orders", 1, 0, max_messages=100).messages
        ]
        assert [m.queue_offset for m in replica.query_by_key("orders", "key-77")] == [25]
    assert log_bytes(tmp_path / "r") == log_bytes(tmp_path / "m")


def test_a_replica_reopens_at_its_end_and_continues(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as master:
        master.put([message(i) for i in range(10)])
        with open_store(tmp_path / "r") as replica:
            ship_all(master, replica)
        master.put([message(i) for i in range(10, 20)])
        with open_store(tmp_path / "r") as replica:  # recovery on the replica's own files
            assert replica.max_offset("orders", 0) == 10
            ship_all(master, replica)
            assert replica.max_offset("orders", 0) == 20
            assert replica.end_offset == master.end_offset


def test_a_chunk_always_holds_one_whole_record(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as master:
        results = master.put([message(i, size=2000) for i in range(3)])
        assert len(master.read_shipment(0, 1)) == results[0].size
        assert len(master.read_shipment(0, results[0].size + 1)) == results[0].size
        assert master.read_shipment(master.end_offset, 1000) == b""


def test_a_corrupt_chunk_is_refused_and_nothing_of_it_written(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as master, open_store(tmp_path / "r") as replica:
        master.put([message(i) for i in range(5)])
        data = bytearray(master.read_shipment(0, 100_000))
        data[-3] ^= 0xFF  # the last record's properties
        with pytest.raises(ShippedDataError):
            replica.append_replicated(0, bytes(data))
        assert replica.end_offset == 0 and replica.max_offset("orders", 0) == 0


def test_a_chunk_at_the_wrong_offset_is_refused(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as master, open_store(tmp_path / "r") as replica:
        first = master.put([message(0)])[0]
        master.put([message(1)])
        second = master.read_shipment(first.end_offset, 100_000)
        with pytest.raises(ShippedDataError, match="names offset"):
            replica.append_replicated(0, second)  # its record says it lives elsewhere


def test_below_the_retained_log_is_gone(tmp_path: Path) -> None:
    with open_store(tmp_path / "m") as master:
        master.put([message(i, size=900) for i in range(200)])
        master._commitlog.delete_oldest()
        with pytest.raises(OffsetGone):
            master.read_shipment(0, 1000)


def test_written_bytes_ship_before_the_masters_fsync_completes(tmp_path: Path) -> None:
    """Under sync flush the master ships what it wrote, so a replica's fsync overlaps its
    own; the write stays invisible (and unacknowledged) on the master until its fsync."""
    with open_store(tmp_path / "m", flush="sync") as master, open_store(tmp_path / "r") as replica:
        disk_free = threading.Event()
        real_sync = master._commitlog.sync

        def slow_sync(up_to: int | None = None) -> int:
            disk_free.wait(10)  # a slow disk: this fsync takes until the test says
            return real_sync(up_to)

        master._commitlog.sync = slow_sync  # type: ignore[method-assign]
        written = threading.Event()
        master.add_write_listener(written.set)
        (result,) = master.append([message(0)])
        try:
            assert written.is_set()
            durable = master.durable(result.end_offset)
            assert not durable.done() and master.visible_offset == 0
            assert ship_all(master, replica) == 1  # shipped while the master's fsync runs
            assert replica.end_offset == result.end_offset
        finally:
            disk_free.set()
        durable.result(10)
        assert master.visible_offset == result.end_offset
