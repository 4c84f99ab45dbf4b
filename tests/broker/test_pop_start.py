"""Where a new consumer group starts reading a queue (pop consumption).

"auto" is RocketMQ 5's rule for a group's first pop (``getInitOffset``, mode MAX):
the queue's first message when the queue still starts at 0 and that message is
hot, otherwise its last message. Auto-created groups use the broker's
``default_consume_from`` (default "auto"), and so do groups created without
an explicit start; an explicit start keeps its meaning.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from halfmoon.broker import Broker, BrokerConfig, FakeClock
from halfmoon.broker.filter_spec import MATCH_ALL
from halfmoon.broker.message import OutgoingMessage
from halfmoon.broker.pop import PopGroupSettings, PopService, default_hot_data_bytes
from halfmoon.store.memory import MemoryStore

TOPIC = "orders"
INVISIBLE = 30_000


def make_pop(store: MemoryStore, clock: FakeClock, consume_from: str, hot: int) -> PopService:
    return PopService(
        store,
        clock,
        topic_queues=lambda topic: [0, 1],
        group_settings=lambda group: PopGroupSettings(consume_from=consume_from),
        dead_letter=lambda *args: None,
        state_path=None,
        hot_data_bytes=hot,
    )


def send(store: MemoryStore, queue_id: int, *bodies: str) -> None:
    store.append([OutgoingMessage(TOPIC, b.encode()).to_store(queue_id=queue_id) for b in bodies])


def received(pop: PopService, group: str = "g") -> list[str]:
    return sorted(v.body.decode() for v in pop.receive(group, TOPIC, None, 32, INVISIBLE))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock.now_ms)


def test_auto_starts_at_the_first_message_of_a_hot_queue(
    store: MemoryStore, clock: FakeClock
) -> None:
    send(store, 0, "a0", "a1", "a2")
    send(store, 1, "b0")
    pop = make_pop(store, clock, "auto", hot=1 << 30)
    assert received(pop) == ["a0", "a1", "a2", "b0"]


def test_auto_starts_at_the_last_message_when_the_start_is_cold(
    store: MemoryStore, clock: FakeClock
) -> None:
    send(store, 0, *[f"old{i}" for i in range(50)])
    send(store, 1, "b0", "b1")
    # Queue 0's first record lies far behind the commit log's end; queue 1's is near it.
    end = store.stats().commit_log_max_offset
    first_of_1 = store.get(TOPIC, 1, 0, 1).messages[0].commit_log_offset
    pop = make_pop(store, clock, "auto", hot=end - first_of_1)
    assert received(pop) == ["b0", "b1", "old49"]


def test_auto_starts_at_the_last_message_when_the_start_was_retained_away(
    store: MemoryStore, clock: FakeClock
) -> None:
    send(store, 0, "m0", "m1", "m2", "m3")
    store.trim(TOPIC, 0, 2)
    pop = make_pop(store, clock, "auto", hot=1 << 30)
    assert received(pop) == ["m3"]


def test_auto_on_an_empty_queue_gets_everything_sent_afterwards(
    store: MemoryStore, clock: FakeClock
) -> None:
    pop = make_pop(store, clock, "auto", hot=1 << 30)
    assert received(pop) == []
    send(store, 0, "n0", "n1")
    assert received(pop) == ["n0", "n1"]


def test_latest_and_earliest_keep_their_meaning(store: MemoryStore, clock: FakeClock) -> None:
    send(store, 0, "m0", "m1")
    assert received(make_pop(store, clock, "latest", hot=1 << 30)) == []
    store.trim(TOPIC, 0, 1)
    assert received(make_pop(store, clock, "earliest", hot=0)) == ["m1"]


def test_the_start_is_fixed_at_first_contact(store: MemoryStore, clock: FakeClock) -> None:
    pop = make_pop(store, clock, "auto", hot=1 << 30)
    send(store, 0, "m0")
    pop.subscribe("g", TOPIC)
    send(store, 0, "m1", "m2")
    assert received(pop) == ["m0", "m1", "m2"]


def test_default_hot_window_is_a_share_of_memory() -> None:
    assert default_hot_data_bytes() > 64 * 1024 * 1024


def test_auto_created_groups_use_the_broker_setting(
    store: MemoryStore, clock: FakeClock, tmp_path: Path
) -> None:
    broker = Broker(store, tmp_path / "meta", BrokerConfig(), clock)
    try:
        broker.create_topic(TOPIC, queue_count=1)
        broker.send([OutgoingMessage(TOPIC, b"before")])
        assert broker.get_group("implicit").consume_from == "auto"
        views = broker.receive("implicit", TOPIC, MATCH_ALL, 32, INVISIBLE)
        assert [v.body for v in views] == [b"before"]
        # A group created without a start gets the default; an explicit one keeps its own.
        assert broker.create_group("plain").consume_from == "auto"
        broker.create_group("explicit", consume_from="latest")
        assert broker.receive("explicit", TOPIC, MATCH_ALL, 32, INVISIBLE) == []
    finally:
        broker.close()


def test_the_broker_wide_default_is_a_setting(
    store: MemoryStore, clock: FakeClock, tmp_path: Path
) -> None:
    broker = Broker(store, tmp_path / "meta", BrokerConfig(default_consume_from="latest"), clock)
    try:
        broker.create_topic(TOPIC, queue_count=1)
        broker.send([OutgoingMessage(TOPIC, b"before")])
        assert broker.get_group("implicit").consume_from == "latest"
        assert broker.receive("implicit", TOPIC, MATCH_ALL, 32, INVISIBLE) == []
    finally:
        broker.close()
