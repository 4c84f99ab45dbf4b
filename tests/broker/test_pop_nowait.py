"""PopService.receive_nowait: the receive an event loop may run, and when it declines."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from halfmoon.broker.broker import Broker as FullBroker
from halfmoon.broker.clock import FakeClock
from halfmoon.broker.facade import Pending, Written
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, MessageView, OutgoingMessage
from halfmoon.broker.pop import PopGroupSettings
from halfmoon.broker.pop_receive import LOOP_BACKLOG_LIMIT
from halfmoon.broker.receipt import InvalidReceiptHandle
from halfmoon.store.memory import MemoryStore
from tests.broker.test_pop import GROUP, INVISIBLE, TOPIC, Broker, bodies


@pytest.fixture
def broker(tmp_path: Path) -> Broker:
    clock = FakeClock()
    return Broker(
        clock=clock,
        store=MemoryStore(clock.now_ms),
        queues={TOPIC: [0, 1]},
        groups={GROUP: PopGroupSettings(consume_from="earliest", max_delivery_attempts=2)},
        state_path=tmp_path / "consumption.json",
    )


def nowait(broker: Broker, batch: int = 32) -> list[MessageView] | None:
    received = broker.pop.receive_nowait(GROUP, TOPIC, None, batch, INVISIBLE)
    return received.views if received is not None else None


def test_it_delivers_what_receive_would_once_the_group_has_touched_the_topic(
    broker: Broker,
) -> None:
    assert broker.receive() == []  # first contact: where the group starts is settled
    broker.send("a", "b", queue_id=0)
    broker.send("c", queue_id=1)
    got = nowait(broker)
    assert got is not None and sorted(bodies(got)) == ["a", "b", "c"]
    for view in got:  # real deliveries: hidden, and acked like any other
        broker.pop.ack(GROUP, TOPIC, view.receipt_handle)
    assert nowait(broker) == []
    assert broker.receive() == []


def test_finding_nothing_it_says_when_an_in_flight_message_is_due(broker: Broker) -> None:
    broker.receive()
    empty = broker.pop.receive_nowait(GROUP, TOPIC, None, 32, INVISIBLE)
    assert empty is not None and empty.views == [] and empty.next_wakeup_ms is None
    broker.send("a")
    assert bodies(nowait(broker) or []) == ["a"]
    waiting = broker.pop.receive_nowait(GROUP, TOPIC, None, 32, INVISIBLE)
    assert waiting is not None and waiting.views == []
    # The same answer a separate next_wakeup_ms call gives (no second call needed).
    assert waiting.next_wakeup_ms == broker.pop.next_wakeup_ms(GROUP, TOPIC)
    assert waiting.next_wakeup_ms == broker.clock.now_ms() + INVISIBLE


def test_it_declines_a_groups_first_contact(broker: Broker) -> None:
    broker.send("a")
    assert nowait(broker) is None  # may read the store's history to choose the start
    assert bodies(broker.receive()) == ["a"]


def test_it_declines_a_group_far_behind_a_queues_end(broker: Broker) -> None:
    broker.receive()
    broker.send(*[f"m{i}" for i in range(LOOP_BACKLOG_LIMIT + 1)], queue_id=0)
    assert nowait(broker) is None  # old data may have to come from disk: a worker's job
    assert len(broker.receive()) == 32
    got = nowait(broker)  # within the limit again: the loop may read it
    assert got is not None and bodies(got)[0] == "m32"


def test_it_declines_while_another_call_holds_the_groups_state(broker: Broker) -> None:
    broker.receive()
    broker.send("a")
    state = broker.pop.states.state(GROUP, TOPIC)
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with state.lock:
            held.set()
            release.wait(5)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(5)
        assert nowait(broker) is None  # returns at once instead of waiting for the lock
    finally:
        release.set()
        thread.join(5)
    got = nowait(broker)
    assert got is not None and bodies(got) == ["a"]


def test_it_declines_when_a_delivery_is_due_again(broker: Broker) -> None:
    broker.receive()
    broker.send("a")
    assert bodies(nowait(broker) or []) == ["a"]
    broker.clock.advance(INVISIBLE + 1)
    # Redelivery may dead-letter (a durable append): that is a worker's job.
    assert nowait(broker) is None
    again = broker.receive()
    assert bodies(again) == ["a"] and again[0].delivery_attempt == 2
    broker.clock.advance(INVISIBLE + 1)
    assert nowait(broker) is None
    assert broker.receive() == []  # the last attempt ran out: dead-lettered by receive
    assert [attempts for _, _, attempts in broker.dead] == [2]


def test_the_facade_declines_what_would_create_metadata_or_is_lite(tmp_path: Path) -> None:
    clock = FakeClock()
    store = MemoryStore(clock.now_ms)
    broker = FullBroker(store, None)
    try:
        broker.create_topic("orders", queue_count=2)
        broker.create_topic("lite-parent", MessageType.LITE, queue_count=1)
        broker.create_group("billing", consume_from="earliest")
        everything = FilterSpec()
        args = (everything, 32, INVISIBLE)
        # Declined: a Pending answer, whose write (the plain receive, on a worker) creates
        # the group's state; nothing is received until it is written.
        declined = broker.receive_nowait("no-such-group", "orders", *args)
        assert isinstance(declined, Pending)
        assert isinstance(broker.receive_nowait("billing", "lite-parent", *args), Pending)
        assert isinstance(broker.receive_nowait("billing", "no-such-topic", *args), Pending)
        assert broker.receive("billing", "orders", *args) == []
        broker.send([OutgoingMessage("orders", b"x")])
        got = broker.receive_nowait("billing", "orders", *args)
        assert isinstance(got, Written) and [v.body for v in got.result.views] == [b"x"]
        broker.send([OutgoingMessage("orders", b"y")])
        written = declined.write()  # the group made as receive makes it, from the start
        assert [v.body for v in written.result.views] == [b"x", b"y"]
        broker.send([OutgoingMessage("orders", b"z")])
        assert [v.body for v in declined.write().result.views] == [b"z"]
    finally:
        broker.close()
        store.close()


def test_ack_many_acks_a_batch_and_reports_each_bad_handle(broker: Broker) -> None:
    broker.receive()
    broker.send("a", "b", "c")
    views = broker.receive()
    handles = [v.receipt_handle for v in views]
    results = broker.pop.ack_many(GROUP, TOPIC, [handles[0], "garbage", handles[2]])
    assert results is not None
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], InvalidReceiptHandle)
    batch = broker.pop.ack_many_nowait(GROUP, TOPIC, [handles[0], handles[1]])
    assert batch is not None
    again, durable = batch
    assert durable.done()  # no journal: nothing to wait for
    assert isinstance(again[0], InvalidReceiptHandle)  # acked already
    assert again[1] is None
    broker.clock.advance(INVISIBLE + 1)
    assert broker.receive() == []  # all three consumed: nothing comes back


def test_ack_many_without_blocking_acks_nothing_while_the_state_is_busy(broker: Broker) -> None:
    broker.receive()
    broker.send("a")
    handle = broker.receive()[0].receipt_handle
    state = broker.pop.states.state(GROUP, TOPIC)
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with state.lock:
            held.set()
            release.wait(5)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(5)
        assert broker.pop.ack_many_nowait(GROUP, TOPIC, [handle]) is None
    finally:
        release.set()
        thread.join(5)
    broker.clock.advance(INVISIBLE + 1)
    assert bodies(broker.receive()) == ["a"]  # not acked: it came back


def test_ack_many_for_a_group_with_nothing_in_flight(broker: Broker) -> None:
    broker.receive()
    broker.send("a")
    handle = broker.receive()[0].receipt_handle
    results = broker.pop.ack_many("other-group", TOPIC, [handle])
    assert results is not None and isinstance(results[0], InvalidReceiptHandle)
