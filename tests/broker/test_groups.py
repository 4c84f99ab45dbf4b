from __future__ import annotations

import json
from pathlib import Path

import pytest

from halfmoon.broker import (
    Broker,
    BrokerConfig,
    FakeClock,
    FilterSpec,
    GroupNotFound,
    IllegalGroup,
    PermissionDenied,
    RetryPolicy,
)
from halfmoon.broker.groups import MAX_GROUP_LENGTH, GroupConfig, GroupRegistry
from halfmoon.broker.message import OutgoingMessage
from halfmoon.broker.topics import MAX_TOPIC_LENGTH, dead_letter_topic
from halfmoon.errors import InvalidArgument
from halfmoon.store.memory import MemoryStore


def test_default_retry_levels_are_rocketmqs() -> None:
    policy = RetryPolicy()
    seconds = [policy.delay_for_attempt(n) // 1000 for n in range(1, 19)]
    assert seconds == [
        1,
        5,
        10,
        30,
        60,
        120,
        180,
        240,
        300,
        360,
        420,
        480,
        540,
        600,
        1200,
        1800,
        3600,
        7200,
    ]
    assert policy.delay_for_attempt(50) == 7_200_000  # the last level repeats
    assert policy.delay_for_attempt(0) == 1_000


def test_exponential_backoff_is_capped() -> None:
    policy = RetryPolicy.exponential(initial_ms=100, max_ms=1_000, multiplier=3)
    assert [policy.delay_for_attempt(n) for n in (1, 2, 3, 4, 5, 10_000)] == [
        100,
        300,
        900,
        1000,
        1000,
        1000,
    ]
    with pytest.raises(InvalidArgument):
        RetryPolicy.exponential(initial_ms=100, max_ms=10, multiplier=2)
    with pytest.raises(InvalidArgument):
        RetryPolicy("linear")


def test_groups_are_auto_created_with_defaults(broker: Broker) -> None:
    group = broker.get_group("g1")
    assert (group.fifo, group.max_delivery_attempts, group.consume_from) == (False, 17, "auto")
    assert [g.name for g in broker.list_groups()] == ["g1"]


def test_auto_creation_can_be_disabled(store: MemoryStore, clock: FakeClock) -> None:
    broker = Broker(store, None, BrokerConfig(auto_create_groups=False), clock)
    broker.create_topic("t")
    with pytest.raises(GroupNotFound) as info:
        broker.pull("nope", "t", 0, 0, 1, FilterSpec())
    assert info.value.code == "CONSUMER_GROUP_NOT_FOUND"


def test_create_update_delete_and_validation(broker: Broker) -> None:
    created = broker.create_group(
        "pay", fifo=True, max_delivery_attempts=3, consume_from="earliest",
        retry_policy=RetryPolicy.exponential(10, 100),
    )  # fmt: skip
    assert created.fifo and created.retry_policy.kind == "exponential"
    updated = broker.update_group("pay", max_delivery_attempts=5, fifo=False)
    assert (updated.max_delivery_attempts, updated.fifo) == (5, False)
    with pytest.raises(InvalidArgument):
        broker.update_group("pay", consume_from="middle")
    with pytest.raises(InvalidArgument):
        broker.update_group("pay", colour="blue")
    with pytest.raises(InvalidArgument):
        broker.create_group("zero", max_delivery_attempts=0)
    with pytest.raises(IllegalGroup) as info:
        broker.create_group("%DLQ%x")
    assert info.value.code == "ILLEGAL_CONSUMER_GROUP"
    broker.delete_group("pay")
    assert broker.groups.find("pay") is None


def test_group_names_leave_room_for_their_dead_letter_topic(broker: Broker) -> None:
    """The longest group dead-letters; one character more is refused when it is created."""
    longest = "g" * MAX_GROUP_LENGTH
    assert len(dead_letter_topic(longest)) <= MAX_TOPIC_LENGTH
    broker.create_topic("t", queue_count=1)
    broker.create_group(longest, consume_from="earliest")
    broker.send([OutgoingMessage("t", b"bad")])
    (msg,) = broker.receive(longest, "t", FilterSpec(), 1, 10_000)
    broker.forward_to_dead_letter(longest, "t", msg.receipt_handle or "")
    dead = broker.pull("x", dead_letter_topic(longest), 0, 0, 10, FilterSpec()).messages
    assert [m.body for m in dead] == [b"bad"]

    too_long = "g" * (MAX_GROUP_LENGTH + 1)
    for create in (
        lambda: broker.create_group(too_long),
        lambda: broker.get_group(too_long),  # auto-creation on first use
    ):
        with pytest.raises(IllegalGroup) as info:
            create()
        assert info.value.code == "ILLEGAL_CONSUMER_GROUP"
        assert f"at most {MAX_GROUP_LENGTH}" in info.value.message
        assert "%DLQ%" in info.value.message
    assert broker.find_group(too_long) is None


def test_disabled_group_cannot_consume(broker: Broker) -> None:
    broker.create_topic("t")
    broker.create_group("off", consume_enabled=False)
    with pytest.raises(PermissionDenied):
        broker.pull("off", "t", 0, 0, 1, FilterSpec())
    with pytest.raises(PermissionDenied):
        broker.receive("off", "t", FilterSpec(), 1, 30_000)


def test_a_group_stored_before_the_name_limit_still_loads(
    store: MemoryStore, clock: FakeClock, tmp_path: Path
) -> None:
    old = GroupConfig("g" * (MAX_GROUP_LENGTH + 2), consume_from="earliest")
    (tmp_path / GroupRegistry.FILE).write_text(
        json.dumps({"version": 1, "groups": [old.to_dict()]})
    )
    broker = Broker(store, tmp_path, clock=clock)
    assert broker.get_group(old.name).consume_from == "earliest"


def test_groups_survive_close_and_reopen(
    store: MemoryStore, clock: FakeClock, tmp_path: Path
) -> None:
    first = Broker(store, tmp_path, clock=clock)
    first.create_group("a", fifo=True, retry_policy=RetryPolicy.customized((5, 50)))
    first.create_group("b", broadcast=True, retry_policy=RetryPolicy.exponential(1, 9, 1.5))
    first.close()
    groups = {g.name: g for g in Broker(store, tmp_path, clock=clock).list_groups()}
    assert groups["a"].fifo and groups["a"].retry_policy.delay_for_attempt(3) == 50
    assert groups["b"].broadcast and groups["b"].retry_policy == RetryPolicy.exponential(1, 9, 1.5)
