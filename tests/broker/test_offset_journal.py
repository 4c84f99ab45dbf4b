"""Committed offsets journaled in the commit log: they survive a crash between snapshots and
reach a replica's store with the log."""

from __future__ import annotations

from pathlib import Path

import pytest

import halfmoon.broker.offsets as offsets_module
from halfmoon.broker import Broker, BrokerConfig, FakeClock
from halfmoon.broker.message import OutgoingMessage
from halfmoon.broker.offset_journal import OffsetJournal
from halfmoon.broker.offsets import OffsetTable
from halfmoon.broker.topics import OFFSETS_TOPIC
from halfmoon.store.store import MessageStore
from tests.broker.conftest import open_real_store


def open_broker(data: Path, meta: Path, clock: FakeClock, *, journal: bool) -> Broker:
    return Broker(open_real_store(data), meta, BrokerConfig(), clock, journal_offsets=journal)


def prepared(broker: Broker) -> None:
    broker.create_topic("orders", queue_count=2)
    broker.create_group("billing")
    broker.send([OutgoingMessage("orders", f"m{i}".encode(), queue_id=i % 2) for i in range(5)])


def crash(broker: Broker) -> None:
    """Lose the broker's in-memory state: no close (its offsets snapshot is never written)."""
    store = broker.store
    assert isinstance(store, MessageStore)
    store.close()


def test_offsets_committed_since_the_snapshot_survive_a_crash(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = open_broker(tmp_path / "d", tmp_path / "m", clock, journal=True)
    prepared(broker)
    broker.update_offset("billing", "orders", 0, 2)
    broker.offsets.persist()  # a snapshot, then more commits after it
    broker.update_offset("billing", "orders", 0, 3)
    broker.update_offset("billing", "orders", 1, 0)
    crash(broker)
    again = open_broker(tmp_path / "d", tmp_path / "m", clock, journal=True)
    try:
        assert again.get_offset("billing", "orders", 0) == 3
        assert again.get_offset("billing", "orders", 1) == 0
        assert OFFSETS_TOPIC not in [t.name for t in again.list_topics()]
    finally:
        again.close()
        again.store.close()


def test_without_the_journal_the_same_crash_loses_them(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = open_broker(tmp_path / "d", tmp_path / "m", clock, journal=False)
    prepared(broker)
    broker.update_offset("billing", "orders", 0, 3)
    crash(broker)
    again = open_broker(tmp_path / "d", tmp_path / "m", clock, journal=False)
    try:
        assert again.offsets.get("billing", "orders", 0) is None
    finally:
        again.close()
        again.store.close()


def test_a_deleted_group_stays_deleted_after_replay(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = open_broker(tmp_path / "d", tmp_path / "m", clock, journal=True)
    prepared(broker)
    broker.update_offset("billing", "orders", 0, 2)
    broker.delete_group("billing")
    crash(broker)
    again = open_broker(tmp_path / "d", tmp_path / "m", clock, journal=True)
    try:
        assert again.offsets.get("billing", "orders", 0) is None
    finally:
        again.close()
        again.store.close()


def test_offsets_reach_a_replica_with_the_log(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = open_broker(tmp_path / "d", tmp_path / "m", clock, journal=True)
    prepared(broker)
    broker.update_offset("billing", "orders", 0, 3)
    broker.update_offset("billing", "orders", 1, 0)
    master = broker.store
    assert isinstance(master, MessageStore)
    replica = open_real_store(tmp_path / "replica")
    try:
        while data := master.read_shipment(replica.end_offset, 1 << 20):
            replica.append_replicated(replica.end_offset, data)
        replica.wait_durable(replica.end_offset)  # visible once flushed (sync flush)
        # A broker opened on the replica's store (no metadata of its own) finds them.
        table = OffsetTable(tmp_path / "replica-meta", journal=OffsetJournal(replica))
        assert table.get("billing", "orders", 0) == 3
        assert table.get("billing", "orders", 1) == 0
    finally:
        replica.close()
        broker.close()
        master.close()


def test_a_full_record_replaces_what_came_before_it(tmp_path: Path) -> None:
    store = open_real_store(tmp_path / "d")
    try:
        journal = OffsetJournal(store)
        journal.record_set("old", "orders", 0, 7)  # its forget was aged out, say
        journal.record_full({("billing", "orders", 0): 3, ("billing", "orders", 1): 1})
        journal.record_set("billing", "orders", 1, 2)
        store.wait_durable(store.end_offset)
        table = OffsetTable(tmp_path / "meta", journal=journal)  # no snapshot: from the start
        assert table.of_group("old") == {}
        assert table.of_group("billing") == {("orders", 0): 3, ("orders", 1): 2}
    finally:
        store.close()


def test_persist_writes_a_full_record_when_enough_records_went_by(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(offsets_module, "FULL_EVERY_RECORDS", 3)
    store = open_real_store(tmp_path / "d")
    try:
        table = OffsetTable(tmp_path / "meta", journal=OffsetJournal(store))
        table.persist()  # the first persist writes one (the table is empty)

        def fulls() -> int:
            messages = store.get(OFFSETS_TOPIC, 0, 0, 1000).messages
            return sum(b'"full"' in m.body for m in messages)

        store.wait_durable(store.end_offset)
        assert fulls() == 1
        for offset in range(2):
            table.set("billing", "orders", 0, offset)
        table.persist()
        store.wait_durable(store.end_offset)
        assert fulls() == 1  # 2 records since: not due
        table.set("billing", "orders", 0, 2)
        table.persist()
        store.wait_durable(store.end_offset)
        assert fulls() == 2
    finally:
        store.close()
