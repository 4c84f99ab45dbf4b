"""Deliveries a broker restart knows of: each receive is journaled, so one made just before a
crash comes back counted (redelivered), and one a live holder holds stays hidden, its
receipt handle still good; a holder's end (``release_held``) makes its deliveries visible
at once, and a requeue ends a hold, both journaled too."""

from __future__ import annotations

from pathlib import Path

from halfmoon.broker import Broker, BrokerConfig, FakeClock
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageView, OutgoingMessage
from tests.broker.test_pop_journal import crash, open_broker

HIDDEN_MS = 30 * 60 * 1000
HOLDER = "etcd-lease:2a"


def started(tmp_path: Path, clock: FakeClock) -> Broker:
    broker = open_broker(tmp_path / "d", tmp_path / "m", clock)
    broker.create_topic("jobs", queue_count=1)
    broker.create_group("workers", consume_from="earliest")
    broker.send([OutgoingMessage("jobs", f"m{i}".encode(), queue_id=0) for i in range(4)])
    return broker


def restarted(tmp_path: Path, clock: FakeClock) -> Broker:
    """The same log and metadata directory, after a crash that wrote no snapshot."""
    return open_broker(tmp_path / "d", tmp_path / "m", clock)


def receive(broker: Broker, count: int, holder: str = "") -> list[MessageView]:
    return broker.receive("workers", "jobs", FilterSpec(), count, HIDDEN_MS, "", None, holder)


def closed(broker: Broker) -> None:
    broker.close()
    broker.store.close()


def test_a_delivery_just_before_a_crash_comes_back_as_a_redelivery(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = started(tmp_path, clock)
    assert [v.delivery_attempt for v in receive(broker, 2)] == [1, 1]
    crash(broker)  # no snapshot since the receive
    again = restarted(tmp_path, clock)
    try:
        got = receive(again, 4)
        assert [(v.body, v.delivery_attempt) for v in got] == [
            (b"m0", 2), (b"m1", 2), (b"m2", 1), (b"m3", 1),
        ]  # fmt: skip
    finally:
        closed(again)


def test_held_deliveries_stay_hidden_across_a_crash_and_their_handles_still_ack(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    broker = started(tmp_path, clock)
    held = receive(broker, 2, HOLDER)
    crash(broker)
    again = restarted(tmp_path, clock)
    try:
        assert again.delivery_holders() == {HOLDER}
        assert [v.body for v in receive(again, 4)] == [b"m2", b"m3"]  # m0, m1 still held
        for view in held:
            assert view.receipt_handle is not None
            again.ack("workers", "jobs", view.receipt_handle)
        clock.advance(HIDDEN_MS)
        assert [v.body for v in receive(again, 4)] == [b"m2", b"m3"]  # m0, m1 acked for good
    finally:
        closed(again)


def test_a_snapshot_keeps_the_hold_too(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = started(tmp_path, clock)
    receive(broker, 2, HOLDER)
    clock.advance(BrokerConfig().offset_persist_interval_ms)
    broker.tick()  # the snapshot: consumption.json holds the holder
    closed(broker)
    again = restarted(tmp_path, clock)
    try:
        assert [v.body for v in receive(again, 4)] == [b"m2", b"m3"]
    finally:
        closed(again)


def test_a_holders_end_releases_its_deliveries_at_once_redelivered(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = started(tmp_path, clock)
    receive(broker, 2, HOLDER)
    receive(broker, 1, "etcd-lease:99")
    assert broker.release_held(HOLDER) == 2
    assert broker.delivery_holders() == {"etcd-lease:99"}
    crash(broker)  # the release was journaled: the restart does not hide them again
    again = restarted(tmp_path, clock)
    try:
        got = receive(again, 4)
        assert [(v.body, v.delivery_attempt) for v in got] == [
            (b"m0", 2), (b"m1", 2), (b"m3", 1),
        ]  # fmt: skip
    finally:
        closed(again)


def test_a_requeue_ends_the_hold_across_a_crash(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = started(tmp_path, clock)
    first, _second = receive(broker, 2, HOLDER)
    assert first.receipt_handle is not None
    broker.change_invisible_duration("workers", "jobs", first.receipt_handle, 0)
    crash(broker)
    again = restarted(tmp_path, clock)
    try:
        assert [v.body for v in receive(again, 4)] == [b"m0", b"m2", b"m3"]  # m1 still held
    finally:
        closed(again)


def test_a_new_master_releases_what_the_old_one_held(tmp_path: Path) -> None:
    """Another broker's receipt handles do not ack here, so a hold it journaled means nothing
    to a new master (the same log, a metadata directory of its own): visible at once."""
    clock = FakeClock()
    broker = started(tmp_path, clock)
    receive(broker, 2, HOLDER)
    crash(broker)
    again = open_broker(tmp_path / "d", tmp_path / "elsewhere", clock)
    again.create_topic("jobs", queue_count=1)  # proxies re-create what etcd places
    again.create_group("workers", consume_from="earliest")
    try:
        assert again.delivery_holders() == set()
        got = receive(again, 4)
        assert [(v.body, v.delivery_attempt) for v in got] == [
            (b"m0", 2), (b"m1", 2), (b"m2", 1), (b"m3", 1),
        ]  # fmt: skip
    finally:
        closed(again)
