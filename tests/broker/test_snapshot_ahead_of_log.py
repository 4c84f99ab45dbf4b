"""Snapshots in ``metadata/`` that claim more than the log holds are set aside for the log.

A broker group member's log can end before what its own snapshots saw: a tail
lost to a crash under an async flush, or cut when a deposed master rejoins the
group. Its offsets, pop state and timer progress then come from the journals
in the log (``offset_journal``, ``pop_journal``, ``timer_journal``), never
from the snapshot: trusting it would skip what the log will hold at the
offsets the snapshot believes consumed. Simulated here with a copy of the data
directory taken earlier (the shorter log) opened with the later metadata.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from halfmoon.broker import Broker, BrokerConfig, FakeClock, FilterSpec, MessageType
from halfmoon.broker.message import OutgoingMessage
from tests.broker.conftest import open_real_store

PERSIST_MS = BrokerConfig().offset_persist_interval_ms


def open_broker(data: Path, meta: Path, clock: FakeClock) -> Broker:
    return Broker(open_real_store(data), meta, BrokerConfig(), clock, journal_offsets=True)


def close(broker: Broker) -> None:
    broker.close()
    broker.store.close()


def test_pop_offsets_and_timer_come_from_the_shorter_log(tmp_path: Path) -> None:
    clock = FakeClock()
    data, meta = tmp_path / "d", tmp_path / "m"
    broker = open_broker(data, meta, clock)
    broker.create_topic("jobs", queue_count=1)
    broker.create_topic("d", MessageType.DELAY, queue_count=1)
    broker.create_group("workers", consume_from="latest")
    assert broker.receive("workers", "jobs", FilterSpec(), 32, 60_000) == []  # first contact
    broker.send([OutgoingMessage("jobs", f"m{i}".encode(), queue_id=0) for i in range(4)])
    broker.update_offset("workers", "jobs", 0, 1)
    close(broker)
    shutil.copytree(data, tmp_path / "shorter")  # the log as far as the other member has it

    broker = open_broker(data, meta, clock)  # the tail the shorter log will not have
    for view in broker.receive("workers", "jobs", FilterSpec(), 32, 60_000):
        broker.ack("workers", "jobs", view.receipt_handle)
    broker.update_offset("workers", "jobs", 0, 4)
    at = clock.now_ms() + 1_000
    broker.send(
        [OutgoingMessage("d", b"tail", message_type=MessageType.DELAY, delivery_timestamp=at)]
    )
    clock.advance(2_000)
    broker.tick()  # delivers 'tail': the timer scanned past the shorter log's timer queue
    close(broker)

    again = open_broker(tmp_path / "shorter", meta, clock)
    try:
        # The acks were in the lost tail: the messages come again rather than being skipped.
        got = again.receive("workers", "jobs", FilterSpec(), 32, 60_000)
        assert [v.body for v in got] == [b"m0", b"m1", b"m2", b"m3"]
        assert again.get_offset("workers", "jobs", 0) == 1
        # A delay message written now takes the timer offset the lost one had: delivered.
        at = clock.now_ms() + 1_000
        again.send(
            [OutgoingMessage("d", b"new", message_type=MessageType.DELAY, delivery_timestamp=at)]
        )
        clock.advance(2_000)
        again.tick()
        assert again.store.wait_durable(again.store.stats().commit_log_max_offset, timeout=10)
        delivered = again.pull("probe", "d", 0, 0, 100, FilterSpec()).messages
        assert [m.body for m in delivered] == [b"new"]
    finally:
        close(again)
