"""The revive scan: expired last deliveries reach the dead-letter callback without a receive."""

from __future__ import annotations

from pathlib import Path

import pytest

from halfmoon.broker import Broker as BrokerFacade
from halfmoon.broker import FakeClock, FilterSpec, OutgoingMessage, dead_letter_topic
from halfmoon.broker.pop import DEAD_LETTER_RETRY_MS, PopGroupSettings
from halfmoon.broker.revive import DEAD_LETTER_LIMIT
from halfmoon.store.memory import MemoryStore
from tests.broker.test_pop import GROUP, INVISIBLE, TOPIC, Broker, bodies


@pytest.fixture
def broker(tmp_path: Path) -> Broker:
    clock = FakeClock()
    return Broker(
        clock=clock,
        store=MemoryStore(clock.now_ms),
        queues={TOPIC: [0]},
        groups={GROUP: PopGroupSettings(consume_from="earliest", max_delivery_attempts=3)},
        state_path=tmp_path / "consumption.json",
    )


def revive(broker: Broker) -> int:
    return broker.pop.revive(broker.clock.now_ms())


def receive_until_last_attempt(broker: Broker, attempts: int = 3) -> str:
    """Receive the one message ``attempts`` times without acking; the last handle."""
    handle = ""
    for attempt in range(1, attempts + 1):
        (view,) = broker.receive()
        assert view.delivery_attempt == attempt
        handle = view.receipt_handle
        if attempt < attempts:
            broker.clock.advance(INVISIBLE)
            assert revive(broker) == 0  # not the last attempt: left for the next receive
    return handle


def test_last_delivery_is_dead_lettered_on_the_first_tick_after_it_expires(
    broker: Broker,
) -> None:
    broker.send("poison")
    receive_until_last_attempt(broker)
    broker.clock.advance(INVISIBLE - 1)
    assert revive(broker) == 0 and broker.dead == []
    broker.clock.advance(1)
    assert revive(broker) == 1
    assert [(g, s.body, n) for g, s, n in broker.dead] == [(GROUP, b"poison", 3)]
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 1, 1, 0)]
    broker.clock.advance(10 * INVISIBLE)
    assert revive(broker) == 0 and broker.receive() == [] and len(broker.dead) == 1


def test_expired_deliveries_before_the_last_wait_for_a_receive(broker: Broker) -> None:
    broker.send("a")
    broker.receive()
    broker.clock.advance(10 * INVISIBLE)
    assert revive(broker) == 0 and broker.dead == []
    assert broker.receive()[0].delivery_attempt == 2


def test_acked_last_delivery_is_not_dead_lettered(broker: Broker) -> None:
    broker.send("fine")
    handle = receive_until_last_attempt(broker)
    broker.pop.ack(GROUP, TOPIC, handle)
    broker.clock.advance(INVISIBLE)
    assert revive(broker) == 0 and broker.dead == []


def test_changed_invisible_duration_postpones_the_dead_lettering(broker: Broker) -> None:
    broker.send("slow")
    handle = receive_until_last_attempt(broker)
    broker.clock.advance(INVISIBLE - 1_000)
    broker.pop.change_invisible_duration(GROUP, TOPIC, handle, 60_000)
    broker.clock.advance(1_000)
    assert revive(broker) == 0  # the old deadline: its watch is stale
    broker.clock.advance(59_000 - 1)
    assert revive(broker) == 0
    broker.clock.advance(1)
    assert revive(broker) == 1 and [s.body for _, s, _ in broker.dead] == [b"slow"]


def test_raised_max_attempts_leaves_the_message_to_the_next_receive(broker: Broker) -> None:
    broker.send("m")
    receive_until_last_attempt(broker)
    broker.groups[GROUP] = PopGroupSettings(consume_from="earliest", max_delivery_attempts=5)
    broker.clock.advance(INVISIBLE)
    assert revive(broker) == 0 and broker.dead == []
    assert broker.receive()[0].delivery_attempt == 4


def test_a_group_with_one_attempt_dead_letters_its_first_delivery(broker: Broker) -> None:
    broker.groups[GROUP] = PopGroupSettings(consume_from="earliest", max_delivery_attempts=1)
    broker.send("once")
    broker.receive()
    broker.clock.advance(INVISIBLE)
    assert revive(broker) == 1 and [n for _, _, n in broker.dead] == [1]


def test_dead_letterings_per_tick_are_bounded(broker: Broker) -> None:
    broker.groups[GROUP] = PopGroupSettings(consume_from="earliest", max_delivery_attempts=1)
    count = DEAD_LETTER_LIMIT * 2 + 5
    broker.send(*[f"m{i}" for i in range(count)])
    assert len(broker.receive(batch=count)) == count
    broker.clock.advance(INVISIBLE)
    per_tick = []
    while len(broker.dead) < count and len(per_tick) < count:
        per_tick.append(revive(broker))
    # The real-time budget may cut a tick short on a slow machine, never the count limit.
    assert max(per_tick) <= DEAD_LETTER_LIMIT and len(per_tick) >= 3 and sum(per_tick) == count
    assert [s.body for _, s, _ in broker.dead] == [f"m{i}".encode() for i in range(count)]


def test_failed_dead_letter_is_retried_in_the_background(broker: Broker) -> None:
    broker.send("poison")
    receive_until_last_attempt(broker)
    broker.clock.advance(INVISIBLE)
    broker.fail_dead_letters = True
    assert revive(broker) == 1 and broker.dead == []
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 0, 1, 1)]  # still in flight, not lost
    broker.fail_dead_letters = False
    broker.clock.advance(DEAD_LETTER_RETRY_MS - 1)
    assert revive(broker) == 0
    broker.clock.advance(1)
    assert revive(broker) == 1 and [s.body for _, s, _ in broker.dead] == [b"poison"]


def test_restored_last_delivery_is_dead_lettered_on_the_first_tick(broker: Broker) -> None:
    broker.send("poison")
    receive_until_last_attempt(broker)
    broker.send("new")
    assert bodies(broker.receive()) == ["new"]  # attempt 1: restored but not its last
    broker.pop.close()
    broker.pop = broker.open()
    assert revive(broker) == 1  # restored deliveries are visible at once
    assert [s.body for _, s, _ in broker.dead] == [b"poison"]
    assert [(v.body, v.delivery_attempt) for v in broker.receive()] == [(b"new", 2)]


def test_fifo_dead_letters_a_queue_in_order(broker: Broker) -> None:
    broker.groups[GROUP] = PopGroupSettings(
        fifo=True, consume_from="earliest", max_delivery_attempts=1
    )
    broker.send("f0", "f1", "f2", message_group="g1")
    assert bodies(broker.receive()) == ["f0", "f1", "f2"]
    broker.clock.advance(INVISIBLE)
    broker.fail_dead_letters = True
    revive(broker)
    assert broker.dead == []  # f0 failed; f1 and f2 wait behind it
    broker.fail_dead_letters = False
    for _ in range(10):
        broker.clock.advance(DEAD_LETTER_RETRY_MS)
        revive(broker)
    assert [s.body for _, s, _ in broker.dead] == [b"f0", b"f1", b"f2"]
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 3, 3, 0)]


def test_watches_of_acked_deliveries_are_compacted(broker: Broker) -> None:
    broker.groups[GROUP] = PopGroupSettings(consume_from="earliest", max_delivery_attempts=1)
    revive_queue = broker.pop._revive
    revive_queue.compact_min = 8
    for i in range(200):
        broker.send(f"m{i}")
        (view,) = broker.receive()
        broker.pop.ack(GROUP, TOPIC, view.receipt_handle)
    assert len(revive_queue) <= 16


def test_facade_tick_moves_the_message_to_the_dead_letter_topic(tmp_path: Path) -> None:
    clock = FakeClock()
    facade = BrokerFacade(MemoryStore(clock.now_ms), tmp_path / "meta", clock=clock)
    try:
        facade.create_topic("t", queue_count=1)
        facade.create_group("g", consume_from="earliest", max_delivery_attempts=1)
        facade.send([OutgoingMessage("t", b"poison", message_id="P1")])
        assert len(facade.receive("g", "t", FilterSpec(), 1, 10_000)) == 1
        clock.advance(10_000)
        facade.tick()
        dead = facade.pull("reader", dead_letter_topic("g"), 0, 0, 10, FilterSpec()).messages
        assert [(m.body, m.message_id) for m in dead] == [(b"poison", "P1")]
    finally:
        facade.close()


def test_a_tick_stops_when_its_time_budget_is_spent(broker: Broker) -> None:
    broker.groups[GROUP] = PopGroupSettings(consume_from="earliest", max_delivery_attempts=1)
    broker.send("a", "b", "c")
    assert len(broker.receive()) == 3
    broker.clock.advance(INVISIBLE)
    broker.pop._revive.budget_ms = -1  # spent before it starts: one dead-lettering per tick
    assert [revive(broker) for _ in range(4)] == [1, 1, 1, 0]
    assert [s.body for _, s, _ in broker.dead] == [b"a", b"b", b"c"]
