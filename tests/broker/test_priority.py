"""Priority topics (RIP-80): a priority is a queue; receives take the highest queue first."""

from __future__ import annotations

import pytest

from halfmoon.broker import Broker, FakeClock
from halfmoon.broker.errors import MessageTypeMismatch
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.broker.priority import IllegalPriority, priority_queue, scan_order

TOPIC = "jobs"
GROUP = "workers"


def priority_message(priority: int | None, body: bytes = b"x") -> OutgoingMessage:
    return OutgoingMessage(TOPIC, body, message_type=MessageType.PRIORITY, priority=priority)


@pytest.fixture
def jobs(broker: Broker) -> Broker:
    broker.create_topic(TOPIC, MessageType.PRIORITY, queue_count=4)
    broker.create_group(GROUP, consume_from="earliest")
    return broker


def receive(broker: Broker, batch: int = 1, group: str = GROUP) -> list:
    return broker.receive(group, TOPIC, FilterSpec(), batch, 30_000)


def test_priority_is_the_queue_clamped_to_the_last_one() -> None:
    assert [priority_queue(p, 4) for p in (0, 1, 3, 4, 1000)] == [0, 1, 3, 3, 3]
    assert scan_order([0, 1, 2, 3]) == [3, 2, 1, 0]


def test_send_routes_by_priority(jobs: Broker) -> None:
    results = jobs.send([priority_message(p) for p in (0, 2, 9)])
    assert [r.queue_id for r in results] == [0, 2, 3]


def test_backlog_is_consumed_highest_priority_first(jobs: Broker) -> None:
    order = [1, 0, 3, 2, 3, 0, 1]
    for i, p in enumerate(order):
        jobs.send([priority_message(p, f"{p}-{i}".encode())])
    got = []
    for _ in order:
        (view,) = receive(jobs)
        got.append(view.body.decode())
        jobs.ack(GROUP, TOPIC, view.receipt_handle)
    assert got == ["3-2", "3-4", "2-3", "1-0", "1-6", "0-1", "0-5"]
    assert [int(b.split("-")[0]) for b in got] == sorted(order, reverse=True)
    assert receive(jobs) == []


def test_one_batch_takes_the_highest_priorities(jobs: Broker) -> None:
    for p in (0, 0, 1, 2, 3):
        jobs.send([priority_message(p)])
    views = receive(jobs, batch=3)
    assert [v.priority for v in views] == [3, 2, 1]
    assert all(v.message_type is MessageType.PRIORITY for v in views)


def test_new_high_priority_message_overtakes_the_backlog(jobs: Broker) -> None:
    for _ in range(5):
        jobs.send([priority_message(0, b"low")])
    (first,) = receive(jobs)
    assert first.body == b"low"
    jobs.send([priority_message(3, b"urgent")])
    (second,) = receive(jobs)
    assert second.body == b"urgent"


def test_fifo_group_keeps_rotating_over_queues(jobs: Broker) -> None:
    jobs.create_group("ordered", fifo=True, consume_from="earliest")
    for p in (0, 3):
        jobs.send([priority_message(p)])
    first = receive(jobs, group="ordered")
    second = receive(jobs, group="ordered")
    # Not the priority order on every call: RocketMQ keeps orderly requests out of it too.
    assert {first[0].queue_id, second[0].queue_id} == {0, 3}


@pytest.mark.parametrize("priority", [-1, True, "2"])
def test_illegal_priority_is_refused(jobs: Broker, priority: object) -> None:
    with pytest.raises(IllegalPriority) as caught:
        jobs.send([priority_message(priority)])  # type: ignore[arg-type]
    assert caught.value.code == "ILLEGAL_MESSAGE_PRIORITY"


def test_priority_message_needs_a_priority(jobs: Broker) -> None:
    with pytest.raises(IllegalPriority):
        jobs.send([priority_message(None)])


def test_priority_and_topic_types_must_match(broker: Broker, jobs: Broker) -> None:
    broker.create_topic("plain", MessageType.NORMAL, queue_count=2)
    with pytest.raises(MessageTypeMismatch):
        broker.send([OutgoingMessage("plain", b"x", priority=1)])
    with pytest.raises(MessageTypeMismatch):  # a priority topic takes priority messages only
        broker.send([OutgoingMessage(TOPIC, b"x")])
    with pytest.raises(MessageTypeMismatch):
        broker.send([OutgoingMessage("plain", b"x", message_type=MessageType.PRIORITY, priority=1)])


def test_a_retried_message_keeps_its_priority(jobs: Broker, clock: FakeClock) -> None:
    for p in (0, 0, 3):
        jobs.send([priority_message(p, f"p{p}".encode())])
    (urgent,) = receive(jobs)
    assert urgent.body == b"p3"  # not acked: it comes back after its invisible time
    (low,) = receive(jobs)
    assert low.body == b"p0"
    clock.advance(30_001)
    (again,) = receive(jobs)
    assert (again.body, again.delivery_attempt) == (b"p3", 2)  # before the low backlog


def test_half_and_delay_messages_with_a_priority_land_in_their_priority(
    jobs: Broker, clock: FakeClock
) -> None:
    """AMQP's priority queues in a transaction or with x-delay: a half or delay message may
    carry a priority to a priority topic (elsewhere it is still a type mismatch)."""
    jobs.send([priority_message(0, b"low")])
    jobs.send(
        [
            OutgoingMessage(
                TOPIC,
                b"committed",
                message_type=MessageType.TRANSACTION,
                transaction_group="tg",
                producer_group="p",
                priority=2,
            ),
            OutgoingMessage(
                TOPIC,
                b"due",
                message_type=MessageType.DELAY,
                delivery_timestamp=clock.now_ms() + 1000,
                priority=3,
            ),
        ]
    )
    assert [v.body for v in receive(jobs, batch=5)] == [b"low"]  # neither visible yet
    jobs.end_transaction_group("tg", "commit")
    clock.advance(1001)
    jobs.tick()
    views = receive(jobs, batch=5, group="second")
    assert [(v.body, v.queue_id) for v in views] == [(b"due", 3), (b"committed", 2), (b"low", 0)]
    with pytest.raises(MessageTypeMismatch):  # a half message without one: still refused
        jobs.send(
            [
                OutgoingMessage(
                    TOPIC,
                    b"x",
                    message_type=MessageType.TRANSACTION,
                    transaction_group="tg2",
                    producer_group="p",
                )
            ]
        )
