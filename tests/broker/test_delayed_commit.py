"""A transaction group member with a delivery time: invisible until the commit like any
member, then in its queue but not delivered before its time, across a crash too; a delivery
time on a plain half message is still refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from halfmoon.broker import Broker, FakeClock
from halfmoon.broker.errors import MessageTypeMismatch
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, MessageView, OutgoingMessage
from tests.broker.test_pop_journal import crash, open_broker

DELAY_MS = 5_000


def member(body: bytes, group: str, due: int | None) -> OutgoingMessage:
    return OutgoingMessage(
        "jobs",
        body,
        message_type=MessageType.TRANSACTION,
        transaction_group=group,
        producer_group="p",
        delivery_timestamp=due,
        queue_id=0,
    )


def receive(broker: Broker) -> list[MessageView]:
    return broker.receive("workers", "jobs", FilterSpec(), 8, 60_000)


def opened(tmp_path: Path, clock: FakeClock) -> Broker:
    broker = open_broker(tmp_path / "d", tmp_path / "m", clock)
    broker.create_topic("jobs", MessageType.MIXED, queue_count=1)
    broker.create_group("workers", consume_from="earliest")
    return broker


def test_a_committed_member_waits_for_its_delivery_time_across_a_crash(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = opened(tmp_path, clock)
    broker.send([member(b"later", "tg", clock.now_ms() + DELAY_MS), member(b"now", "tg", None)])
    assert receive(broker) == []  # not committed yet
    broker.end_transaction_group("tg", "commit")
    got = receive(broker)
    assert [v.body for v in got] == [b"now"]  # "later" is in its queue, not yet due
    crash(broker)  # the deferral was journaled with the receive that walked past it
    again = open_broker(tmp_path / "d", tmp_path / "m", clock)
    try:
        assert [v.body for v in receive(again)] == [b"now"]  # in flight at the crash: again
        clock.advance(DELAY_MS)
        due = receive(again)
        assert [(v.body, v.delivery_attempt) for v in due] == [(b"later", 1)]
    finally:
        again.close()
        again.store.close()


def test_a_delivery_time_needs_a_transaction_group(tmp_path: Path) -> None:
    clock = FakeClock()
    broker = opened(tmp_path, clock)
    try:
        with pytest.raises(MessageTypeMismatch):
            broker.send([member(b"x", "", clock.now_ms() + DELAY_MS)])
    finally:
        broker.close()
        broker.store.close()
