from __future__ import annotations

import pytest

from halfmoon.broker import (
    Broker,
    FakeClock,
    FilterSpec,
    InvalidReceiptHandle,
    MessageType,
    OutgoingMessage,
    dead_letter_topic,
)
from halfmoon.broker.errors import IllegalQueueId
from halfmoon.store.memory import MemoryStore


def test_receive_ack_and_redelivery_through_the_facade(broker: Broker, clock: FakeClock) -> None:
    broker.create_topic("t", queue_count=2)
    broker.create_group("g", consume_from="earliest")
    broker.send([OutgoingMessage("t", b"a", tag="x"), OutgoingMessage("t", b"b", tag="y")])
    got = broker.receive("g", "t", FilterSpec("TAG", "x"), 10, 30_000)
    assert (
        [m.body for m in got] == [b"a"] and got[0].receipt_handle and got[0].delivery_attempt == 1
    )
    assert broker.receive("g", "t", FilterSpec("TAG", "x"), 10, 30_000) == []
    assert broker.next_wakeup_ms("g", "t") == clock.now_ms() + 30_000
    new_handle = broker.change_invisible_duration("g", "t", got[0].receipt_handle, 1_000)
    with pytest.raises(InvalidReceiptHandle):
        broker.ack("g", "t", got[0].receipt_handle)
    clock.advance(1_000)
    again = broker.receive("g", "t", FilterSpec("TAG", "x"), 10, 30_000)
    assert [m.body for m in again] == [b"a"] and again[0].delivery_attempt == 2
    with pytest.raises(InvalidReceiptHandle):
        broker.ack("g", "t", new_handle)
    broker.ack("g", "t", again[0].receipt_handle)
    progress = {p.queue_id: p for p in broker.group_progress("g", "t")}
    assert sum(p.inflight for p in progress.values()) == 0
    assert sum(p.lag for p in progress.values()) == 0


def test_receive_from_one_queue_through_the_facade(broker: Broker) -> None:
    broker.create_topic("t", queue_count=2)
    broker.create_group("g", consume_from="earliest")
    broker.send([OutgoingMessage("t", f"m{i}".encode()) for i in range(8)])
    per_queue = {q: broker.receive("g", "t", FilterSpec(), 32, 30_000, queue_id=q) for q in (0, 1)}
    for queue_id, views in per_queue.items():
        assert views and {v.queue_id for v in views} == {queue_id}
    assert sum(len(v) for v in per_queue.values()) == 8
    with pytest.raises(IllegalQueueId) as raised:
        broker.receive("g", "t", FilterSpec(), 1, 30_000, queue_id=2)
    assert raised.value.code == "BAD_REQUEST" and "no queue 2" in raised.value.message


def test_max_attempts_moves_the_message_to_a_consumable_dead_letter_topic(
    broker: Broker, clock: FakeClock
) -> None:
    broker.create_topic("t", queue_count=1)
    broker.create_group("g", consume_from="earliest", max_delivery_attempts=2)
    broker.send([OutgoingMessage("t", b"poison", message_id="P1")])
    for _ in range(2):
        assert [m.body for m in broker.receive("g", "t", FilterSpec(), 1, 10_000)] == [b"poison"]
        clock.advance(10_000)
    assert broker.receive("g", "t", FilterSpec(), 1, 10_000) == []
    dlq = dead_letter_topic("g")
    assert dlq in [t.name for t in broker.list_topics()]
    broker.create_group("dlq-reader", consume_from="earliest")
    dead = broker.receive("dlq-reader", dlq, FilterSpec(), 10, 10_000)
    assert [(m.body, m.message_id, m.topic) for m in dead] == [(b"poison", "P1", dlq)]


def test_forward_to_dead_letter(broker: Broker) -> None:
    broker.create_topic("t", queue_count=1)
    broker.create_group("g", consume_from="earliest")
    broker.send([OutgoingMessage("t", b"bad")])
    (msg,) = broker.receive("g", "t", FilterSpec(), 1, 10_000)
    broker.forward_to_dead_letter("g", "t", msg.receipt_handle or "")
    assert [
        m.body for m in broker.pull("x", dead_letter_topic("g"), 0, 0, 10, FilterSpec()).messages
    ] == [b"bad"]


def test_arrival_listener_sees_visible_messages_only(broker: Broker, clock: FakeClock) -> None:
    broker.create_topic("t", queue_count=1)
    broker.create_topic("d", MessageType.DELAY, queue_count=1)
    seen: list[tuple[str, int]] = []
    broker.add_arrival_listener(lambda topic, queue: seen.append((topic, queue)))
    broker.send([OutgoingMessage("t", b"x")])
    broker.send(
        [
            OutgoingMessage(
                "d", b"y", message_type=MessageType.DELAY, delivery_timestamp=clock.now_ms() + 10
            )
        ]
    )
    assert seen == [("t", 0)]
    clock.advance(10)
    broker.tick()
    assert seen == [("t", 0), ("d", 0)]


def test_status_counts_and_one_minute_rates(broker: Broker, clock: FakeClock) -> None:
    broker.create_topic("t", queue_count=1)
    broker.create_group("g", consume_from="earliest")
    broker.send([OutgoingMessage("t", b"x") for _ in range(120)])
    broker.pull("p", "t", 0, 0, 60, FilterSpec())
    status = broker.status()
    assert (status.messages_in_total, status.messages_out_total) == (120, 60)
    assert status.tps_in == pytest.approx(2.0) and status.tps_out == pytest.approx(1.0)
    assert (status.topics, status.groups) == (1, 2) and status.disk_bytes > 0
    clock.advance(30_000)
    broker.send([OutgoingMessage("t", b"x") for _ in range(60)])
    assert broker.status().tps_in == pytest.approx(3.0)  # both bursts still in the minute
    clock.advance(31_000)
    assert broker.status().tps_in == pytest.approx(1.0)  # the first burst slid out
    clock.advance(60_000)
    status = broker.status()
    assert status.tps_in == 0 and status.messages_in_total == 180


def test_delete_group_forgets_offsets_and_pop_state(broker: Broker) -> None:
    broker.create_topic("t", queue_count=1)
    broker.send([OutgoingMessage("t", b"x")])
    broker.create_group("g", consume_from="earliest")
    broker.update_offset("g", "t", 0, 1)
    (msg,) = broker.receive("g", "t", FilterSpec(), 1, 10_000)
    broker.delete_group("g")
    with pytest.raises(InvalidReceiptHandle):
        broker.ack("g", "t", msg.receipt_handle or "")
    assert broker.offsets.get("g", "t", 0) is None


def test_consumption_state_survives_close_and_reopen(
    store: MemoryStore, clock: FakeClock, tmp_path
) -> None:
    first = Broker(store, tmp_path, clock=clock)
    first.create_topic("t", queue_count=1)
    first.create_group("g", consume_from="earliest")
    first.send([OutgoingMessage("t", b"1"), OutgoingMessage("t", b"2")])
    (one,) = first.receive("g", "t", FilterSpec(), 1, 10_000)
    first.ack("g", "t", one.receipt_handle or "")
    first.close()
    second = Broker(store, tmp_path, clock=clock)
    assert [m.body for m in second.receive("g", "t", FilterSpec(), 10, 10_000)] == [b"2"]
