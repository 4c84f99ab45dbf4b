"""Pop consumers' positions journaled in the commit log (``%HM_POP%``): a broker opened on the
same log with none of the master's metadata (a new master after a failover) goes on where
the group stood, delivering again what was in flight, never skipping what it had not acked."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest

from halfmoon.broker import Broker, BrokerConfig, FakeClock
from halfmoon.broker.facade import Written
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.broker.topics import POP_TOPIC
from halfmoon.cluster.errors import NotEnoughReplicas
from halfmoon.store.store import MessageStore
from tests.broker.conftest import open_real_store


def open_broker(data: Path, meta: Path, clock: FakeClock, *, journal: bool = True) -> Broker:
    return Broker(open_real_store(data), meta, BrokerConfig(), clock, journal_offsets=journal)


def crash(broker: Broker) -> None:
    store = broker.store
    assert isinstance(store, MessageStore)
    store.close()


def send(broker: Broker, first: int, count: int) -> None:
    broker.send(
        [OutgoingMessage("jobs", f"m{i}".encode(), queue_id=0) for i in range(first, first + count)]
    )


def bodies(broker: Broker, count: int = 32) -> list[str]:
    got = broker.receive("workers", "jobs", FilterSpec(), count, 60_000)
    for view in got:
        broker.ack("workers", "jobs", view.receipt_handle)
    return [view.body.decode() for view in got]


def prepared(tmp_path: Path, clock: FakeClock, *, journal: bool = True) -> Broker:
    broker = open_broker(tmp_path / "d", tmp_path / "m1", clock, journal=journal)
    broker.create_topic("jobs", queue_count=1)
    broker.create_group("workers", consume_from="latest")
    send(broker, 0, 3)  # before the group's first contact: not the group's
    assert broker.receive("workers", "jobs", FilterSpec(), 32, 60_000) == []
    send(broker, 3, 6)
    return broker


def on_a_new_master(tmp_path: Path, clock: FakeClock, *, journal: bool = True) -> Broker:
    """The same log, a metadata directory of its own: what a replica taking office has."""
    again = open_broker(tmp_path / "d", tmp_path / "m2", clock, journal=journal)
    again.create_topic("jobs", queue_count=1)  # proxies re-create what etcd places
    again.create_group("workers", consume_from="latest")
    return again


def test_a_new_master_starts_the_group_where_it_started_not_at_the_end(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = prepared(tmp_path, clock)
    in_flight = broker.receive("workers", "jobs", FilterSpec(), 2, 60_000)
    assert [v.body for v in in_flight] == [b"m3", b"m4"]  # received, never acked
    crash(broker)
    again = on_a_new_master(tmp_path, clock)
    try:
        assert bodies(again) == [f"m{i}" for i in range(3, 9)]
        assert POP_TOPIC not in [t.name for t in again.list_topics()]
    finally:
        again.close()
        again.store.close()


def test_without_the_journal_the_new_master_skips_them(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = prepared(tmp_path, clock, journal=False)
    crash(broker)
    again = on_a_new_master(tmp_path, clock, journal=False)
    try:
        assert bodies(again) == []  # m3..m8 lost: the group started over at the end
    finally:
        again.close()
        again.store.close()


def test_acks_journaled_at_a_snapshot_are_not_delivered_again(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = prepared(tmp_path, clock)
    assert bodies(broker, 4) == ["m3", "m4", "m5", "m6"]
    broker.tick()  # not yet a snapshot
    clock.advance(BrokerConfig().offset_persist_interval_ms)
    broker.tick()  # the snapshot journals the position: m7
    after = broker.receive("workers", "jobs", FilterSpec(), 1, 60_000)
    assert [v.body for v in after] == [b"m7"]  # in flight at the crash
    crash(broker)
    again = on_a_new_master(tmp_path, clock)
    try:
        assert bodies(again) == ["m7", "m8"]
    finally:
        again.close()
        again.store.close()


def test_a_dropped_group_starts_over_on_the_new_master(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = prepared(tmp_path, clock)
    broker.delete_group("workers")
    crash(broker)
    again = on_a_new_master(tmp_path, clock)
    try:
        assert bodies(again) == []  # a first contact again: at the end
    finally:
        again.close()
        again.store.close()


def test_a_restarted_broker_replays_what_its_snapshot_lacks(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = prepared(tmp_path, clock)
    broker.close()  # a snapshot, holding the first contact
    broker.store.close()
    broker = open_broker(tmp_path / "d", tmp_path / "m1", clock)
    try:
        assert bodies(broker, 2) == ["m3", "m4"]
        assert broker._pop.progress("workers", "jobs") == [(0, 5, 5, 0)]
    finally:
        broker.close()
        broker.store.close()


def test_acks_above_a_message_in_flight_are_kept_and_its_attempt_counted(tmp_path: Path) -> None:
    """m3 received and never acked, m4..m6 acked after it: the journaled queue holds m3 in
    flight, so the new master delivers m3 again (its second attempt) but not m4..m6."""
    clock = FakeClock()
    broker = prepared(tmp_path, clock)
    got = broker.receive("workers", "jobs", FilterSpec(), 4, 60_000)
    assert [v.body for v in got] == [b"m3", b"m4", b"m5", b"m6"]
    for view in got[1:]:
        broker.ack("workers", "jobs", view.receipt_handle)
    clock.advance(BrokerConfig().offset_persist_interval_ms)
    broker.tick()  # the snapshot journals the queue
    crash(broker)
    again = on_a_new_master(tmp_path, clock)
    try:
        redelivered = again.receive("workers", "jobs", FilterSpec(), 32, 60_000)
        assert [(v.body, v.delivery_attempt) for v in redelivered] == [
            (b"m3", 2),
            (b"m7", 1),
            (b"m8", 1),
        ]
    finally:
        again.close()
        again.store.close()


def test_acks_after_the_last_snapshot_are_not_delivered_again(tmp_path: Path) -> None:
    """Each ack batch is its own record: acked after the snapshot journaled the queue (m4, m6
    in flight there; m7 past its cursor), a new master delivers only what was never acked."""
    clock = FakeClock()
    broker = prepared(tmp_path, clock)
    got = broker.receive("workers", "jobs", FilterSpec(), 4, 60_000)
    assert [v.body for v in got] == [b"m3", b"m4", b"m5", b"m6"]
    clock.advance(BrokerConfig().offset_persist_interval_ms)
    broker.tick()  # the snapshot journals the queue: m3..m6 in flight
    broker.ack("workers", "jobs", got[1].receipt_handle)
    written = broker.ack_nowait("workers", "jobs", [got[3].receipt_handle])  # on a loop
    assert isinstance(written, Written) and written.result == [None]
    written.durable.result(5)
    later = broker.receive("workers", "jobs", FilterSpec(), 1, 60_000)
    assert [v.body for v in later] == [b"m7"]  # past the journaled cursor
    broker.ack("workers", "jobs", later[0].receipt_handle)
    crash(broker)
    again = on_a_new_master(tmp_path, clock)
    try:
        redelivered = again.receive("workers", "jobs", FilterSpec(), 32, 60_000)
        assert [(v.body, v.delivery_attempt) for v in redelivered] == [
            (b"m3", 2),
            (b"m5", 2),
            (b"m8", 1),
        ]
    finally:
        again.close()
        again.store.close()


def test_an_ack_answers_with_the_error_of_its_records_durability(tmp_path: Path) -> None:
    """Under sync replication a record's durability fails with NOT_ENOUGH_REPLICAS when too
    few replicas are in sync: the ack says so, as an offset commit does."""
    clock = FakeClock()
    broker = prepared(tmp_path, clock)
    got = broker.receive("workers", "jobs", FilterSpec(), 3, 60_000)
    failed: Future[None] = Future()
    failed.set_exception(NotEnoughReplicas("1 in sync, 2 required"))
    store = broker.store
    asked: list[int] = []

    def durable(end_offset: int) -> Future[None]:
        asked.append(end_offset)
        return failed

    store.durable = durable  # type: ignore[method-assign]
    with pytest.raises(NotEnoughReplicas):
        broker.ack("workers", "jobs", got[0].receipt_handle)
    results = broker._pop.ack_many("workers", "jobs", [got[1].receipt_handle, "garbled"])
    assert isinstance(results[0], NotEnoughReplicas)
    assert results[1] is not None and not isinstance(results[1], NotEnoughReplicas)
    # On an event loop: the acks are applied, their answer is the record's durability.
    written = broker.ack_nowait("workers", "jobs", [got[2].receipt_handle])
    assert isinstance(written, Written) and written.result == [None]
    assert isinstance(written.durable.exception(1), NotEnoughReplicas)
    assert len(asked) == 3 and asked[2] > asked[1] > asked[0]
    crash(broker)


def test_a_broker_without_a_journal_records_no_acks(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = prepared(tmp_path, clock, journal=False)
    got = broker.receive("workers", "jobs", FilterSpec(), 2, 60_000)
    written = broker.ack_nowait("workers", "jobs", [v.receipt_handle for v in got])
    assert isinstance(written, Written) and written.result == [None, None]
    assert written.durable.done()
    assert broker.store.max_offset(POP_TOPIC, 0) == 0
    crash(broker)


def _lite_broker(data: Path, meta: Path, clock: FakeClock, *, journal: bool) -> Broker:
    broker = open_broker(data, meta, clock, journal=journal)
    broker.create_topic("chat", MessageType.LITE, queue_count=1)
    broker.create_group("bots")
    broker.sync_lite_subscription("c1", "bots", "chat", "complete_add", ["s1"])
    return broker


def _lite_bodies(broker: Broker) -> list[str]:
    out: list[str] = []
    while got := broker.receive("bots", "chat", FilterSpec(), 16, 60_000, "c1"):
        for view in got:
            broker.ack("bots", "chat", view.receipt_handle, lite_topic="s1")
            out.append(view.body.decode())
    return out


@pytest.mark.parametrize("journal", [True, False], ids=["journaled", "not-journaled"])
def test_lite_consumption_moves_to_a_new_master_with_the_log(tmp_path: Path, journal: bool) -> None:
    """Lite topics have a pop service of their own; its positions are journaled too (a
    queue of their own): acked ones are not delivered again, the rest are."""
    clock = FakeClock()
    broker = _lite_broker(tmp_path / "d", tmp_path / "m1", clock, journal=journal)
    lite = MessageType.LITE
    broker.send(
        [
            OutgoingMessage("chat", f"m{i}".encode(), message_type=lite, lite_topic="s1")
            for i in range(4)
        ]
    )
    first = broker.receive("bots", "chat", FilterSpec(), 2, 60_000, "c1")
    assert [v.body for v in first] == [b"m0", b"m1"]
    broker.ack("bots", "chat", first[0].receipt_handle, lite_topic="s1")  # m1 in flight
    crash(broker)
    again = _lite_broker(tmp_path / "d", tmp_path / "m2", clock, journal=journal)
    try:
        if journal:
            assert _lite_bodies(again) == ["m1", "m2", "m3"]  # m0 acked: not again
        else:
            assert _lite_bodies(again) == ["m0", "m1", "m2", "m3"]  # starts over
        assert POP_TOPIC not in [t.name for t in again.list_topics()]
    finally:
        again.close()
        again.store.close()
