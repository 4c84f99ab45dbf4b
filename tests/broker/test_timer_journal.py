"""The delay timer's progress journaled in the commit log (``%HM_TIMER_PROGRESS%``): a broker
opened on the same log with none of the master's metadata (a new master after a failover)
delivers again only what came due after the last record, delivers what is pending at its
time, and never delivers a recalled message."""

from __future__ import annotations

from pathlib import Path

from halfmoon.broker import Broker, BrokerConfig, FakeClock, FilterSpec, MessageType
from halfmoon.broker.message import OutgoingMessage
from halfmoon.broker.topics import TIMER_PROGRESS_TOPIC
from halfmoon.store.store import MessageStore
from tests.broker.conftest import open_real_store

PERSIST_MS = BrokerConfig().offset_persist_interval_ms


def open_broker(data: Path, meta: Path, clock: FakeClock, *, journal: bool = True) -> Broker:
    return Broker(open_real_store(data), meta, BrokerConfig(), clock, journal_offsets=journal)


def delay(clock: FakeClock, in_ms: int, body: str) -> OutgoingMessage:
    at = clock.now_ms() + in_ms
    return OutgoingMessage(
        "d", body.encode(), message_type=MessageType.DELAY, delivery_timestamp=at
    )


def delivered(broker: Broker) -> list[str]:
    """Every copy in the real topic (a delivery made twice is there twice)."""
    assert broker.store.wait_durable(broker.store.stats().commit_log_max_offset, timeout=10)
    got = broker.pull("probe", "d", 0, 0, 1000, FilterSpec()).messages
    return [m.body.decode() for m in got]


def crash(broker: Broker) -> None:
    store = broker.store
    assert isinstance(store, MessageStore)
    store.close()


def prepared(tmp_path: Path, clock: FakeClock, *, journal: bool = True) -> Broker:
    """'early' delivered and its delivery journaled; 'late' and 'recalled' pending."""
    broker = open_broker(tmp_path / "d", tmp_path / "m1", clock, journal=journal)
    broker.create_topic("d", MessageType.DELAY, queue_count=1)
    broker.send([delay(clock, 1_000, "early")])
    (late,) = broker.send([delay(clock, 60_000, "late")])
    (recalled,) = broker.send([delay(clock, 60_000, "recalled")])
    assert recalled.recall_handle
    broker.recall("d", recalled.recall_handle)
    broker.tick()
    clock.advance(2_000)
    broker.tick()
    clock.advance(PERSIST_MS)
    broker.tick()  # persists the progress: 'early' delivered
    assert delivered(broker) == ["early"]
    return broker


def on_a_new_master(tmp_path: Path, clock: FakeClock, *, journal: bool = True) -> Broker:
    again = open_broker(tmp_path / "d", tmp_path / "m2", clock, journal=journal)
    again.create_topic("d", MessageType.DELAY, queue_count=1)
    return again


def test_a_new_master_resumes_the_timer_where_the_last_record_left_it(tmp_path: Path) -> None:
    clock = FakeClock()
    crash(prepared(tmp_path, clock))
    again = on_a_new_master(tmp_path, clock)
    try:
        again.tick()
        assert delivered(again) == ["early"]  # not delivered a second time
        clock.advance(60_000 - 2_000 - PERSIST_MS - 1)
        again.tick()
        assert delivered(again) == ["early"]  # 'late' not before its time
        clock.advance(1)
        again.tick()
        assert delivered(again) == ["early", "late"]  # 'recalled' never
        assert TIMER_PROGRESS_TOPIC not in [t.name for t in again.list_topics()]
    finally:
        again.close()
        again.store.close()


def test_without_the_journal_a_new_master_delivers_again_and_forgets_the_recall(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    crash(prepared(tmp_path, clock, journal=False))
    again = on_a_new_master(tmp_path, clock, journal=False)
    try:
        again.tick()
        assert delivered(again) == ["early", "early"]
        clock.advance(60_000)
        again.tick()
        assert sorted(delivered(again)) == ["early", "early", "late", "recalled"]
    finally:
        again.close()
        again.store.close()


def test_a_restart_takes_the_newer_of_the_file_and_the_journal(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = prepared(tmp_path, clock)
    broker.close()
    broker.store.close()
    again = open_broker(tmp_path / "d", tmp_path / "m1", clock)
    try:
        clock.advance(60_000)
        again.tick()
        assert delivered(again) == ["early", "late"]
    finally:
        again.close()
        again.store.close()
