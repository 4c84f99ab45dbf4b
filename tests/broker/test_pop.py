"""PopService: receive / ack / invisible time / redelivery / dead letters / FIFO."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from halfmoon.broker.clock import FakeClock
from halfmoon.broker.filter import compile_filter
from halfmoon.broker.message import MessageType, MessageView, OutgoingMessage
from halfmoon.broker.pop import DEAD_LETTER_RETRY_MS, PopGroupSettings, PopService
from halfmoon.broker.receipt import (
    MAX_INVISIBLE_MS,
    MIN_RECEIVE_INVISIBLE_MS,
    IllegalInvisibleTime,
    InvalidReceiptHandle,
)
from halfmoon.errors import InvalidArgument
from halfmoon.store.memory import MemoryStore
from halfmoon.store.message import StoredMessage

TOPIC = "orders"
GROUP = "billing"
INVISIBLE = 30_000


@dataclass
class Broker:
    """A PopService wired to a MemoryStore, with the facade's callbacks faked."""

    clock: FakeClock
    store: MemoryStore
    queues: dict[str, list[int]]
    groups: dict[str, PopGroupSettings]
    state_path: Path | None
    dead: list[tuple[str, StoredMessage, int]] = field(default_factory=list)
    fail_dead_letters: bool = False
    pop: PopService = field(init=False)

    def __post_init__(self) -> None:
        self.pop = self.open()

    def open(self) -> PopService:
        return PopService(
            self.store,
            self.clock,
            topic_queues=self.topic_queues,
            group_settings=lambda group: self.groups.get(group, PopGroupSettings()),
            dead_letter=self.dead_letter,
            state_path=self.state_path,
        )

    def topic_queues(self, topic: str) -> list[int]:
        if topic not in self.queues:
            raise LookupError(f"no topic {topic}")
        return self.queues[topic]

    def dead_letter(self, group: str, stored: StoredMessage, attempts: int) -> None:
        if self.fail_dead_letters:
            raise OSError("disk full")
        self.dead.append((group, stored, attempts))

    def send(self, *bodies: str, queue_id: int = 0, tag: str | None = None, **kw) -> None:
        messages = [
            OutgoingMessage(TOPIC, body.encode(), tag=tag, **kw).to_store(queue_id=queue_id)
            for body in bodies
        ]
        self.store.append(messages)

    def receive(
        self,
        batch: int = 32,
        group: str = GROUP,
        matcher=None,
        invisible: int = INVISIBLE,
        queue_id: int | None = None,
    ):
        return self.pop.receive(group, TOPIC, matcher, batch, invisible, queue_id)


def bodies(views: list[MessageView]) -> list[str]:
    return [v.body.decode() for v in views]


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


def test_batch_receive(broker: Broker) -> None:
    broker.send(*[f"m{i}" for i in range(10)])
    first = broker.receive(batch=4)
    assert bodies(first) == ["m0", "m1", "m2", "m3"]
    assert [v.queue_offset for v in first] == [0, 1, 2, 3]
    for view in first:
        assert view.delivery_attempt == 1
        assert view.invisible_duration_ms == INVISIBLE
        assert view.receipt_handle
    assert len({v.receipt_handle for v in first}) == 4
    assert bodies(broker.receive(batch=32)) == [f"m{i}" for i in range(4, 10)]
    assert broker.receive() == []


def test_batch_receive_spreads_over_queues(broker: Broker) -> None:
    broker.queues[TOPIC] = [0, 1, 2]
    for queue_id in (0, 1, 2):
        broker.send(f"q{queue_id}a", f"q{queue_id}b", queue_id=queue_id)
    got = broker.receive(batch=32)
    assert sorted(bodies(got)) == ["q0a", "q0b", "q1a", "q1b", "q2a", "q2b"]
    # Each receive starts one queue further along.
    for queue_id in (0, 1, 2):
        broker.send(f"x{queue_id}", queue_id=queue_id)
    starts = [broker.receive(batch=1)[0].queue_id for _ in range(3)]
    assert sorted(starts) == [0, 1, 2]


def test_concurrent_consumers_never_share_an_invisible_message(broker: Broker) -> None:
    broker.queues[TOPIC] = [0, 1, 2, 3]
    total = 2000
    for queue_id in range(4):
        broker.send(*[f"{queue_id}-{i}" for i in range(total // 4)], queue_id=queue_id)
    received: list[list[str]] = [[], [], [], []]
    barrier = threading.Barrier(4)

    def consume(slot: int) -> None:
        barrier.wait()
        while True:
            views = broker.receive(batch=7)
            if not views:
                return
            received[slot].extend(bodies(views))
            # Ack half of them: acks race with the other consumers' receives.
            for view in views[::2]:
                broker.pop.ack(GROUP, TOPIC, view.receipt_handle)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    everything = [b for got in received for b in got]
    assert len(everything) == total
    assert len(set(everything)) == total
    assert all(received), "every consumer got a share"


def test_ack_advances_committed_over_out_of_order_acks(broker: Broker) -> None:
    broker.send(*[f"m{i}" for i in range(6)])
    views = broker.receive(batch=6)
    handles = [v.receipt_handle for v in views]
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 0, 6, 6)]
    for index in (4, 2, 1, 5):
        broker.pop.ack(GROUP, TOPIC, handles[index])
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 0, 6, 2)]
    broker.pop.ack(GROUP, TOPIC, handles[0])
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 3, 6, 1)]
    broker.pop.ack(GROUP, TOPIC, handles[3])
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 6, 6, 0)]
    with pytest.raises(InvalidReceiptHandle):
        broker.pop.ack(GROUP, TOPIC, handles[3])  # twice


def test_retrying_counts_the_in_flight_messages_delivered_more_than_once(broker: Broker) -> None:
    assert broker.pop.retrying(GROUP, TOPIC) == {}
    broker.send("a", "b", "c")
    first = broker.receive(batch=3)
    assert broker.pop.retrying(GROUP, TOPIC) == {0: 0}  # in flight, first delivery each
    broker.pop.ack(GROUP, TOPIC, first[2].receipt_handle)
    broker.clock.advance(INVISIBLE)
    again = broker.receive(batch=3)
    assert sorted(v.delivery_attempt for v in again) == [2, 2]
    assert broker.pop.retrying(GROUP, TOPIC) == {0: 2}
    broker.pop.ack(GROUP, TOPIC, again[0].receipt_handle)
    assert broker.pop.retrying(GROUP, TOPIC) == {0: 1}
    broker.pop.ack(GROUP, TOPIC, again[1].receipt_handle)
    assert broker.pop.retrying(GROUP, TOPIC) == {0: 0}
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 3, 3, 0)]


def test_ready_counts_what_a_receive_would_hand_out_now(broker: Broker) -> None:
    assert broker.pop.ready(GROUP, TOPIC) == {}
    broker.send("a", "b", "c", "d")
    a, b, c = broker.receive(batch=3)
    assert broker.pop.ready(GROUP, TOPIC) == {0: 1}  # "d", never delivered
    broker.pop.ack(GROUP, TOPIC, b.receipt_handle)  # done above the committed "a"
    assert broker.pop.ready(GROUP, TOPIC) == {0: 1}
    broker.pop.change_invisible_duration(GROUP, TOPIC, c.receipt_handle, 0)  # requeued
    assert broker.pop.ready(GROUP, TOPIC) == {0: 2}
    broker.clock.advance(INVISIBLE)  # "a" times out
    assert broker.pop.ready(GROUP, TOPIC) == {0: 3}
    assert len(broker.receive(batch=4)) == 3
    assert broker.pop.ready(GROUP, TOPIC) == {0: 0}


def test_requeued_messages_go_out_in_queue_order_whenever_they_were_requeued(
    broker: Broker,
) -> None:
    broker.send("a", "b", "c")
    views = broker.receive(batch=3)
    for view in reversed(views):  # "c" first, "a" last
        broker.pop.change_invisible_duration(GROUP, TOPIC, view.receipt_handle, 0)
        broker.clock.advance(5)
    assert [v.body for v in broker.receive(batch=3)] == [b"a", b"b", b"c"]


def test_unacked_message_reappears_after_invisible_time(broker: Broker) -> None:
    broker.send("a")
    (first,) = broker.receive()
    broker.clock.advance(INVISIBLE - 1)
    assert broker.receive() == []
    broker.clock.advance(1)
    (again,) = broker.receive()
    assert again.body == b"a"
    assert again.queue_offset == first.queue_offset
    assert again.delivery_attempt == 2
    assert again.receipt_handle != first.receipt_handle
    with pytest.raises(InvalidReceiptHandle):
        broker.pop.ack(GROUP, TOPIC, first.receipt_handle)
    broker.pop.ack(GROUP, TOPIC, again.receipt_handle)
    broker.clock.advance(10 * INVISIBLE)
    assert broker.receive() == []


def test_ack_after_expiry_but_before_redelivery_is_accepted(broker: Broker) -> None:
    broker.send("a")
    (view,) = broker.receive()
    broker.clock.advance(INVISIBLE * 2)
    broker.pop.ack(GROUP, TOPIC, view.receipt_handle)
    assert broker.receive() == []


def test_change_invisible_duration_extends_and_invalidates_old_handle(broker: Broker) -> None:
    broker.send("a")
    (view,) = broker.receive()
    broker.clock.advance(INVISIBLE - 1000)
    new_handle = broker.pop.change_invisible_duration(GROUP, TOPIC, view.receipt_handle, 60_000)
    assert new_handle != view.receipt_handle
    with pytest.raises(InvalidReceiptHandle):
        broker.pop.ack(GROUP, TOPIC, view.receipt_handle)
    with pytest.raises(InvalidReceiptHandle):
        broker.pop.change_invisible_duration(GROUP, TOPIC, view.receipt_handle, 60_000)
    broker.clock.advance(59_999)
    assert broker.receive() == []  # the original deadline passed long ago
    broker.clock.advance(1)
    (again,) = broker.receive()
    assert again.delivery_attempt == 2
    with pytest.raises(InvalidReceiptHandle):
        broker.pop.ack(GROUP, TOPIC, new_handle)  # redelivered: that handle is over too
    broker.pop.ack(GROUP, TOPIC, again.receipt_handle)


def test_change_invisible_duration_to_zero_makes_it_visible_now(broker: Broker) -> None:
    broker.send("a")
    (view,) = broker.receive()
    broker.pop.change_invisible_duration(GROUP, TOPIC, view.receipt_handle, 0)
    (again,) = broker.receive()
    assert again.delivery_attempt == 2


def test_max_attempts_dead_letters_exactly_once(broker: Broker) -> None:
    broker.send("poison", "fine")
    attempts = []
    for _ in range(3):
        views = broker.receive()
        assert bodies(views)[0] == "poison"
        attempts.append(views[0].delivery_attempt)
        for view in views[1:]:
            broker.pop.ack(GROUP, TOPIC, view.receipt_handle)
        broker.clock.advance(INVISIBLE)
    assert attempts == [1, 2, 3]
    assert broker.receive() == []
    assert len(broker.dead) == 1
    group, stored, count = broker.dead[0]
    assert (group, stored.body, stored.queue_offset, count) == (GROUP, b"poison", 0, 3)
    for _ in range(3):
        broker.clock.advance(INVISIBLE)
        assert broker.receive() == []
    assert len(broker.dead) == 1
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 2, 2, 0)]


def test_failed_dead_letter_is_retried_and_not_lost(broker: Broker) -> None:
    broker.groups[GROUP] = PopGroupSettings(consume_from="earliest", max_delivery_attempts=1)
    broker.send("poison")
    broker.receive()
    broker.clock.advance(INVISIBLE)
    broker.fail_dead_letters = True
    assert broker.receive() == []
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 0, 1, 1)]
    assert broker.pop.next_wakeup_ms(GROUP, TOPIC) == broker.clock.now_ms() + DEAD_LETTER_RETRY_MS
    broker.fail_dead_letters = False
    broker.clock.advance(DEAD_LETTER_RETRY_MS)
    assert broker.receive() == []
    assert [d[1].body for d in broker.dead] == [b"poison"]
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 1, 1, 0)]


def test_forward_to_dead_letter(broker: Broker) -> None:
    broker.send("a", "b")
    first, second = broker.receive()
    broker.pop.forward_to_dead_letter(GROUP, TOPIC, first.receipt_handle)
    assert [(d[1].body, d[2]) for d in broker.dead] == [(b"a", 1)]
    with pytest.raises(InvalidReceiptHandle):
        broker.pop.ack(GROUP, TOPIC, first.receipt_handle)
    broker.pop.ack(GROUP, TOPIC, second.receipt_handle)
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 2, 2, 0)]


def test_filter_skips_count_as_consumed(broker: Broker) -> None:
    broker.send("a1", tag="A")
    broker.send("b1", tag="B")
    broker.send("a2", tag="A", properties={"region": "eu"})
    broker.send("b2", tag="B")
    views = broker.receive(matcher=compile_filter("TAG", "A"))
    assert bodies(views) == ["a1", "a2"]
    for view in views:
        broker.pop.ack(GROUP, TOPIC, view.receipt_handle)
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 4, 4, 0)]
    # SQL92 is decided on properties after the read; skips still count.
    broker.send("x", properties={"region": "us"})
    broker.send("y", properties={"region": "eu"})
    views = broker.receive(matcher=compile_filter("SQL92", "region = 'eu'"))
    assert bodies(views) == ["y"]
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 5, 6, 1)]
    broker.pop.ack(GROUP, TOPIC, views[0].receipt_handle)
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 6, 6, 0)]


def test_filter_matching_nothing_does_not_walk_the_whole_queue_in_one_receive(
    broker: Broker,
) -> None:
    broker.send(*[f"b{i}" for i in range(5000)], tag="B")
    broker.send("a", tag="A")
    matcher = compile_filter("TAG", "A")
    got: list[MessageView] = []
    for _ in range(100):
        got = broker.receive(matcher=matcher)
        if got:
            break
    assert bodies(got) == ["a"]


def test_new_group_latest_skips_history_earliest_reads_it(broker: Broker) -> None:
    broker.groups["late"] = PopGroupSettings(consume_from="latest")
    broker.groups["early"] = PopGroupSettings(consume_from="earliest")
    broker.send("old1", "old2")
    assert broker.receive(group="late") == []
    assert bodies(broker.receive(group="early")) == ["old1", "old2"]
    broker.send("new")
    assert bodies(broker.receive(group="late")) == ["new"]


def test_subscribe_fixes_a_latest_group_start_before_the_first_receive(broker: Broker) -> None:
    broker.groups["late"] = PopGroupSettings(consume_from="latest")
    broker.send("old")
    broker.pop.subscribe("late", TOPIC)
    broker.send("new")
    assert bodies(broker.receive(group="late")) == ["new"]


def test_queue_added_later_is_read_from_its_start_by_a_latest_group(broker: Broker) -> None:
    broker.groups["late"] = PopGroupSettings(consume_from="latest")
    assert broker.receive(group="late") == []
    broker.queues[TOPIC] = [0, 1]
    broker.send("in-new-queue", queue_id=1)
    assert bodies(broker.receive(group="late")) == ["in-new-queue"]


def fifo(broker: Broker, attempts: int = 3) -> None:
    broker.groups[GROUP] = PopGroupSettings(
        fifo=True, consume_from="earliest", max_delivery_attempts=attempts
    )


def send_ordered(broker: Broker, *names: str, queue_id: int = 0) -> None:
    broker.send(*names, queue_id=queue_id, message_group="g1", message_type=MessageType.FIFO)


def test_fifo_second_message_waits_for_first_ack(broker: Broker) -> None:
    fifo(broker)
    broker.queues[TOPIC] = [0, 1]
    send_ordered(broker, "first", "second")
    send_ordered(broker, "other", queue_id=1)
    got = broker.receive(batch=1) + broker.receive(batch=1)
    assert sorted(bodies(got)) == ["first", "other"]
    assert broker.receive() == []
    first = next(v for v in got if v.body == b"first")
    broker.pop.ack(GROUP, TOPIC, first.receipt_handle)
    assert bodies(broker.receive()) == ["second"]


def test_fifo_batch_is_an_ordered_run_and_blocks_the_queue(broker: Broker) -> None:
    fifo(broker)
    send_ordered(broker, "1", "2", "3")
    assert bodies(broker.receive(batch=2)) == ["1", "2"]
    assert broker.receive() == []


def test_fifo_failed_first_message_comes_back_before_second(broker: Broker) -> None:
    fifo(broker)
    send_ordered(broker, "first", "second")
    (first,) = broker.receive(batch=1)
    broker.clock.advance(INVISIBLE)
    (again,) = broker.receive(batch=1)
    assert (again.body, again.delivery_attempt) == (b"first", 2)
    broker.clock.advance(INVISIBLE)
    views = broker.receive(batch=2)
    assert [(v.body, v.delivery_attempt) for v in views] == [(b"first", 3), (b"second", 1)]


def test_fifo_extended_later_message_keeps_an_expired_earlier_one_waiting(broker: Broker) -> None:
    fifo(broker)
    send_ordered(broker, "1", "2")
    one, two = broker.receive(batch=2)
    broker.pop.change_invisible_duration(GROUP, TOPIC, two.receipt_handle, 3 * INVISIBLE)
    broker.clock.advance(INVISIBLE)
    assert broker.receive() == []
    assert broker.pop.next_wakeup_ms(GROUP, TOPIC) == broker.clock.now_ms() + 2 * INVISIBLE


def test_fifo_dead_lettered_message_lets_queue_move_on(broker: Broker) -> None:
    fifo(broker, attempts=2)
    send_ordered(broker, "poison", "next")
    broker.receive(batch=1)
    broker.clock.advance(INVISIBLE)
    broker.receive(batch=1)
    broker.clock.advance(INVISIBLE)
    views = broker.receive(batch=1)
    assert [(d[1].body, d[2]) for d in broker.dead] == [(b"poison", 2)]
    assert bodies(views) == ["next"]


def test_receive_from_a_named_queue_takes_only_that_queue(broker: Broker) -> None:
    broker.queues[TOPIC] = [0, 1, 2]
    for queue_id in (0, 1, 2):
        broker.send(f"q{queue_id}a", f"q{queue_id}b", queue_id=queue_id)
    assert bodies(broker.receive(queue_id=1)) == ["q1a", "q1b"]
    assert broker.receive(queue_id=1) == []
    # The others are untouched, and still there for a receive of any queue.
    assert sorted(bodies(broker.receive())) == ["q0a", "q0b", "q2a", "q2b"]


def test_receive_from_a_queue_the_topic_does_not_read_gets_nothing(broker: Broker) -> None:
    broker.queues[TOPIC] = [0, 1]
    broker.send("q0", queue_id=0)
    broker.send("q2", queue_id=2)  # stored, but not a readable queue of the topic
    assert broker.receive(queue_id=2) == []
    assert bodies(broker.receive()) == ["q0"]


def test_fifo_named_queue_stays_blocked_for_everyone_while_in_flight(broker: Broker) -> None:
    fifo(broker)
    broker.queues[TOPIC] = [0, 1]
    send_ordered(broker, "first", "second")
    send_ordered(broker, "other", queue_id=1)
    (first,) = broker.receive(batch=1, queue_id=0)
    assert first.body == b"first"
    # Neither a receive of that queue nor one of any queue takes "second" now.
    assert broker.receive(queue_id=0) == []
    assert bodies(broker.receive()) == ["other"]
    assert broker.receive(queue_id=0) == []
    broker.pop.ack(GROUP, TOPIC, first.receipt_handle)
    assert bodies(broker.receive(queue_id=0)) == ["second"]


def test_fifo_group_does_not_order_messages_without_a_message_group(broker: Broker) -> None:
    fifo(broker)
    broker.send("a", "b")
    assert bodies(broker.receive(batch=1)) == ["a"]
    assert bodies(broker.receive(batch=1)) == ["b"]


def test_snapshot_and_restore(broker: Broker) -> None:
    broker.send(*[f"m{i}" for i in range(6)])
    views = broker.receive(batch=4)  # m0..m3 in flight
    broker.clock.advance(INVISIBLE)
    again = broker.receive(batch=1)  # m0 again, attempt 2
    assert (again[0].body, again[0].delivery_attempt) == (b"m0", 2)
    broker.pop.ack(GROUP, TOPIC, views[2].receipt_handle)  # m2 acked above committed
    broker.pop.ack(GROUP, TOPIC, views[1].receipt_handle)
    broker.pop.close()
    before = broker.pop.progress(GROUP, TOPIC)
    assert before == [(0, 0, 4, 2)]

    restarted = broker.open()
    assert restarted.progress(GROUP, TOPIC) == before
    # A handle from before the restart still acks what it names.
    restarted.ack(GROUP, TOPIC, views[3].receipt_handle)
    got = restarted.receive(GROUP, TOPIC, None, 32, INVISIBLE)
    # m0 redelivered at once with its attempt count kept; m1..m3 done; then new ones.
    assert [(v.body, v.delivery_attempt) for v in got] == [(b"m0", 3), (b"m4", 1), (b"m5", 1)]
    with pytest.raises(InvalidReceiptHandle):
        restarted.ack(GROUP, TOPIC, again[0].receipt_handle)


def test_unsaved_acks_are_redelivered_after_a_restart(broker: Broker) -> None:
    broker.send("a", "b")
    views = broker.receive()
    broker.pop.snapshot()
    for view in views:
        broker.pop.ack(GROUP, TOPIC, view.receipt_handle)
    # No snapshot: as after a crash, the acks are lost and both come back.
    restarted = broker.open()
    got = restarted.receive(GROUP, TOPIC, None, 32, INVISIBLE)
    assert [(v.body, v.delivery_attempt) for v in got] == [(b"a", 2), (b"b", 2)]
    assert {v.receipt_handle for v in got}.isdisjoint({v.receipt_handle for v in views})


def test_snapshot_writes_only_when_something_changed(broker: Broker) -> None:
    assert broker.state_path is not None
    broker.send("a")
    (view,) = broker.receive()
    broker.pop.snapshot()
    stamp = broker.state_path.stat().st_mtime_ns
    text = broker.state_path.read_text()
    broker.pop.snapshot()
    assert broker.state_path.stat().st_mtime_ns == stamp
    broker.pop.ack(GROUP, TOPIC, view.receipt_handle)
    broker.pop.snapshot()
    assert broker.state_path.read_text() != text
    assert json.loads(broker.state_path.read_text())["topics"][0]["queues"][0]["inflight"] == []


def test_drop_group_and_reset(broker: Broker) -> None:
    broker.send("a", "b", "c")
    (view,) = broker.receive(batch=1)
    broker.pop.reset(GROUP, TOPIC, 0, 2)
    with pytest.raises(InvalidReceiptHandle):
        broker.pop.ack(GROUP, TOPIC, view.receipt_handle)
    assert bodies(broker.receive()) == ["c"]
    broker.pop.drop_group(GROUP)
    assert broker.pop.progress(GROUP, TOPIC) == []
    assert bodies(broker.receive()) == ["a", "b", "c"]  # earliest again
    broker.pop.close()
    assert [(q[0], q[2]) for q in broker.open().progress(GROUP, TOPIC)] == [(0, 3)]


def test_messages_aged_out_of_the_store(broker: Broker) -> None:
    broker.send(*[f"m{i}" for i in range(5)])
    (view,) = broker.receive(batch=1)
    broker.store.trim(TOPIC, 0, 3)
    broker.clock.advance(INVISIBLE)
    # m0 is gone while in flight; m1, m2 were never read: all count as consumed.
    assert bodies(broker.receive()) == ["m3", "m4"]
    assert broker.pop.progress(GROUP, TOPIC) == [(0, 3, 5, 2)]
    with pytest.raises(InvalidReceiptHandle):
        broker.pop.ack(GROUP, TOPIC, view.receipt_handle)


def test_handle_of_another_group_or_topic_is_rejected(broker: Broker) -> None:
    broker.groups["other"] = PopGroupSettings(consume_from="earliest")
    broker.queues["elsewhere"] = [0]
    broker.send("a")
    (mine,) = broker.receive()
    (theirs,) = broker.receive(group="other")
    with pytest.raises(InvalidReceiptHandle):
        broker.pop.ack(GROUP, TOPIC, theirs.receipt_handle)
    with pytest.raises(InvalidReceiptHandle):
        broker.pop.ack(GROUP, "elsewhere", mine.receipt_handle)
    with pytest.raises(InvalidReceiptHandle):
        broker.pop.ack("nobody", TOPIC, mine.receipt_handle)
    broker.pop.ack(GROUP, TOPIC, mine.receipt_handle)
    broker.pop.ack("other", TOPIC, theirs.receipt_handle)


@settings(max_examples=300, deadline=None)
@given(garbage=st.one_of(st.text(max_size=200), st.text(alphabet="ABCDEFabcdef0123456789-_=")))
def test_garbled_handles_raise_invalid_receipt_handle_only(garbage: str) -> None:
    clock = FakeClock()
    store = MemoryStore(clock.now_ms)
    pop = PopService(
        store,
        clock,
        topic_queues=lambda topic: [0],
        group_settings=lambda group: PopGroupSettings(consume_from="earliest"),
        dead_letter=lambda *args: None,
        state_path=None,
    )
    store.append([OutgoingMessage(TOPIC, b"x").to_store()])
    (view,) = pop.receive(GROUP, TOPIC, None, 1, INVISIBLE)
    for candidate in (garbage, view.receipt_handle[:-1] + garbage, garbage + view.receipt_handle):
        if candidate == view.receipt_handle:
            continue
        with pytest.raises(InvalidReceiptHandle):
            pop.ack(GROUP, TOPIC, candidate)
        with pytest.raises(InvalidReceiptHandle):
            pop.change_invisible_duration(GROUP, TOPIC, candidate, 1000)
        with pytest.raises(InvalidReceiptHandle):
            pop.forward_to_dead_letter(GROUP, TOPIC, candidate)
    pop.ack(GROUP, TOPIC, view.receipt_handle)


def test_handle_forged_with_another_key_is_rejected(broker: Broker, tmp_path: Path) -> None:
    broker.send("a")
    (view,) = broker.receive()
    stranger = Broker(
        clock=broker.clock,
        store=broker.store,
        queues=broker.queues,
        groups=broker.groups,
        state_path=tmp_path / "other.json",
    )
    (theirs,) = stranger.receive()  # same message, same position, another broker's key
    with pytest.raises(InvalidReceiptHandle):
        broker.pop.ack(GROUP, TOPIC, theirs.receipt_handle)
    broker.pop.ack(GROUP, TOPIC, view.receipt_handle)


@pytest.mark.parametrize(
    "invisible", [-1, 0, MIN_RECEIVE_INVISIBLE_MS - 1, MAX_INVISIBLE_MS + 1, 2**63]
)
def test_receive_rejects_invisible_time_out_of_range(broker: Broker, invisible: int) -> None:
    broker.send("a")
    with pytest.raises(IllegalInvisibleTime):
        broker.receive(invisible=invisible)
    assert broker.pop.progress(GROUP, TOPIC) == []  # nothing happened


@pytest.mark.parametrize("invisible", [-1, MAX_INVISIBLE_MS + 1])
def test_change_rejects_invisible_time_out_of_range(broker: Broker, invisible: int) -> None:
    broker.send("a")
    (view,) = broker.receive()
    with pytest.raises(IllegalInvisibleTime):
        broker.pop.change_invisible_duration(GROUP, TOPIC, view.receipt_handle, invisible)
    broker.pop.ack(GROUP, TOPIC, view.receipt_handle)  # the old handle still holds


def test_invisible_time_bounds_are_inclusive(broker: Broker) -> None:
    broker.send("a")
    (view,) = broker.receive(invisible=MIN_RECEIVE_INVISIBLE_MS)
    broker.pop.change_invisible_duration(GROUP, TOPIC, view.receipt_handle, MAX_INVISIBLE_MS)


def test_bad_batch_size_is_rejected(broker: Broker) -> None:
    with pytest.raises(InvalidArgument):
        broker.receive(batch=0)


def test_unknown_topic_error_comes_from_the_facade_callback(broker: Broker) -> None:
    with pytest.raises(LookupError):
        broker.pop.receive(GROUP, "missing", None, 1, INVISIBLE)


def test_next_wakeup_ms(broker: Broker) -> None:
    assert broker.pop.next_wakeup_ms(GROUP, TOPIC) is None
    broker.send("a", "b")
    start = broker.clock.now_ms()
    first, second = broker.receive()
    assert broker.pop.next_wakeup_ms(GROUP, TOPIC) == start + INVISIBLE
    broker.pop.change_invisible_duration(GROUP, TOPIC, first.receipt_handle, 5 * INVISIBLE)
    assert broker.pop.next_wakeup_ms(GROUP, TOPIC) == start + INVISIBLE
    broker.pop.ack(GROUP, TOPIC, second.receipt_handle)
    assert broker.pop.next_wakeup_ms(GROUP, TOPIC) == start + 5 * INVISIBLE
    broker.clock.advance(5 * INVISIBLE)
    (again,) = broker.receive()
    assert broker.pop.next_wakeup_ms(GROUP, TOPIC) == broker.clock.now_ms() + INVISIBLE
    broker.pop.ack(GROUP, TOPIC, again.receipt_handle)
    assert broker.pop.next_wakeup_ms(GROUP, TOPIC) is None
