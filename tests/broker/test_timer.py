from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from halfmoon.broker import (
    Broker,
    BrokerConfig,
    FakeClock,
    FilterSpec,
    MessageType,
    OutgoingMessage,
)
from halfmoon.store.memory import MemoryStore


def delay(at: int, body: bytes = b"d", topic: str = "d", **kw: object) -> OutgoingMessage:
    return OutgoingMessage(topic, body, message_type=MessageType.DELAY, delivery_timestamp=at, **kw)  # type: ignore[arg-type]


def settle(broker: Broker) -> None:
    """Wait until everything written is durable, hence visible (a real store under sync)."""
    assert broker.store.wait_durable(broker.store.stats().commit_log_max_offset, timeout=10)


def delivered(broker: Broker, topic: str = "d") -> list[bytes]:
    settle(broker)
    bodies = []
    for route in broker.route(topic):
        bodies += [
            m.body
            for m in broker.pull("probe", topic, route.queue_id, 0, 1000, FilterSpec()).messages
        ]
    return bodies


def test_delivered_at_its_time_and_not_before(broker: Broker, clock: FakeClock) -> None:
    broker.create_topic("d", MessageType.DELAY, queue_count=2)
    arrivals: list[tuple[str, int]] = []
    broker.add_arrival_listener(lambda t, q: arrivals.append((t, q)))
    now = clock.now_ms()
    sent = broker.send(
        [
            delay(now + 10_000, b"late", tag="x", keys=["k"], message_id="ID1"),
            delay(now + 2_000, b"soon"),
        ]
    )
    assert all(r.queue_offset == -1 for r in sent) and arrivals == []
    broker.tick()
    assert delivered(broker) == [] and broker.timer.pending == 2
    clock.advance(1_999)
    broker.tick()
    assert delivered(broker) == []
    clock.advance(1)
    broker.tick()
    assert delivered(broker) == [b"soon"]
    assert arrivals == [("d", sent[1].queue_id)]
    clock.advance(8_000)
    broker.tick()
    assert sorted(delivered(broker)) == [b"late", b"soon"]
    late = broker.pull("probe", "d", sent[0].queue_id, 0, 10, FilterSpec()).messages[0]
    assert (late.message_id, late.tag, late.keys, late.topic) == ("ID1", "x", ["k"], "d")
    assert late.delivery_timestamp == now + 10_000 and late.properties == {}
    assert broker.timer.pending == 0 and broker.status().pending_delay_messages == 0


def test_memory_holds_only_entries_due_within_the_window(
    store: MemoryStore, clock: FakeClock
) -> None:
    config = BrokerConfig(timer_window_ms=60_000, timer_max_heap=1_000)
    broker = Broker(store, None, config, clock)
    broker.create_topic("d", MessageType.DELAY, queue_count=1)
    now = clock.now_ms()
    broker.send([delay(now + 3_600_000 + i, b"far") for i in range(50)])
    broker.send([delay(now + 5_000 + i, b"near") for i in range(5)])
    broker.tick()
    assert broker.timer.heap_size == 5 and broker.timer.pending == 55
    clock.advance(6_000)
    broker.tick()
    assert delivered(broker) == [b"near"] * 5 and broker.timer.heap_size == 0
    clock.set(now + 3_600_000 - 20_000)  # the far ones enter the window: loaded from disk
    broker.tick()
    assert broker.timer.heap_size == 50 and len(delivered(broker)) == 5
    clock.set(now + 3_600_000 + 49)
    broker.tick()
    assert len(delivered(broker)) == 55 and broker.timer.pending == 0


def test_heap_cap_still_delivers_everything_exactly_once(
    store: MemoryStore, clock: FakeClock
) -> None:
    broker = Broker(store, None, BrokerConfig(timer_max_heap=7), clock)
    broker.create_topic("d", MessageType.DELAY, queue_count=1)
    now = clock.now_ms()
    broker.send([delay(now + 1_000 + (i % 5), str(i).encode()) for i in range(40)])
    broker.tick()
    assert broker.timer.heap_size <= 7
    clock.advance(10_000)
    broker.tick()
    assert sorted(delivered(broker)) == sorted(str(i).encode() for i in range(40))
    broker.tick()
    assert len(delivered(broker)) == 40


def test_progress_survives_close_and_reopen_without_duplicates(
    store: MemoryStore, clock: FakeClock, tmp_path: Path
) -> None:
    first = Broker(store, tmp_path, clock=clock)
    first.create_topic("d", MessageType.DELAY, queue_count=1)
    now = clock.now_ms()
    first.send(
        [delay(now + 1_000, b"a"), delay(now + 2 * 3_600_000, b"b"), delay(now + 3_000, b"c")]
    )
    clock.advance(1_500)
    first.tick()
    first.close()
    second = Broker(store, tmp_path, clock=clock)
    second.tick()
    assert delivered(second) == [b"a"] and second.timer.pending == 2
    clock.advance(2_000)
    second.tick()
    assert delivered(second) == [b"a", b"c"]
    clock.advance(2 * 3_600_000)
    second.tick()
    assert delivered(second) == [b"a", b"c", b"b"]


def test_crash_before_progress_is_saved_redelivers_rather_than_loses(
    store: MemoryStore, clock: FakeClock, tmp_path: Path
) -> None:
    first = Broker(store, tmp_path, BrokerConfig(offset_persist_interval_ms=60_000), clock)
    first.create_topic("d", MessageType.DELAY, queue_count=1)
    first.send([delay(clock.now_ms() + 1_000 * i, str(i).encode()) for i in range(1, 4)])
    first.tick()
    clock.advance(1_000)
    first.tick()  # "1" delivered; progress not persisted yet (interval not reached)
    second = Broker(store, tmp_path, clock=clock)  # the first one is never closed: a crash
    clock.advance(5_000)
    second.tick()
    bodies = delivered(second)
    assert set(bodies) == {b"1", b"2", b"3"}  # nothing lost
    assert bodies.count(b"2") == 1 and bodies.count(b"3") == 1  # only the unsaved window repeats


def test_delay_survives_restart_on_a_real_store(
    real_broker: Callable[..., Broker], clock: FakeClock
) -> None:
    broker = real_broker()
    broker.create_topic("d", MessageType.DELAY, queue_count=2)
    now = clock.now_ms()
    broker.send(
        [
            delay(now + 1_000, b"one"),
            delay(now + 60_000, b"two"),
            delay(now + 3 * 86_400_000, b"three"),
        ]
    )
    settle(broker)
    clock.advance(1_000)
    broker.tick()
    assert delivered(broker) == [b"one"]
    broker = real_broker()  # closes the broker and the store, reopens both
    broker.tick()
    assert delivered(broker) == [b"one"] and broker.timer.pending == 2
    clock.advance(59_000)
    broker.tick()
    assert sorted(delivered(broker)) == [b"one", b"two"]
    broker = real_broker()
    clock.advance(3 * 86_400_000)
    broker.tick()
    assert sorted(delivered(broker)) == [b"one", b"three", b"two"]
