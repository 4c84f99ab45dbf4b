"""Where a proxy puts each message of a send (``send_plan``): one round-robin draw per message,
whether the plan is made once on the event loop or again on a worker thread."""

from __future__ import annotations

from collections import Counter

import pytest

from halfmoon.broker.message import OutgoingMessage
from halfmoon.cluster.coordination.placement import QueueAssignment
from halfmoon.cluster.proxy.routing import Layout
from halfmoon.cluster.proxy.send_plan import Draws, NeedsThread, Rotation, plan_sends

# Placed as etcd places a spread topic: brokers alternate, b first.
ALTERNATING = Layout(
    "orders",
    [QueueAssignment(q, "broker-b" if q % 2 == 0 else "broker-a", q // 2) for q in range(4)],
)


def _message(topic: str = "orders", group: str | None = None) -> OutgoingMessage:
    return OutgoingMessage(topic, b"x", message_group=group)


def _layout(topic: str) -> Layout:
    return ALTERNATING


def _every_broker(broker: str) -> bool:
    return True


def _stale(broker: str) -> bool:
    raise NeedsThread  # the event loop does not know whether the broker takes sends


def _brokers(parts: dict[str, list[tuple[int, OutgoingMessage, Layout]]]) -> list[str]:
    return [broker for broker, part in parts.items() for _ in part]


def test_sends_planned_again_on_a_thread_alternate_as_placed() -> None:
    rotation = Rotation()
    landed = []
    for _ in range(16):
        draws = Draws(rotation)
        with pytest.raises(NeedsThread):
            plan_sends([_message()], _layout, _stale, draws)
        landed += _brokers(plan_sends([_message()], _layout, _every_broker, draws))
    assert landed == ["broker-b", "broker-a"] * 8


def test_a_call_planned_twice_keeps_each_messages_queue() -> None:
    rotation = Rotation()
    draws = Draws(rotation)
    first_topic_only = {"orders"}

    def layout_of(topic: str) -> Layout:
        if topic not in first_topic_only:
            raise NeedsThread  # a topic etcd does not place: after the first message drew
        return ALTERNATING

    messages = [_message(), _message("other"), _message()]
    with pytest.raises(NeedsThread):
        plan_sends(messages, layout_of, _every_broker, draws)
    first_topic_only.add("other")
    parts = plan_sends(messages, layout_of, _every_broker, draws)
    queues = {index: m.queue_id for part in parts.values() for index, m, _ in part}
    brokers = {index: broker for broker, part in parts.items() for index, _, _ in part}
    # Each topic's counter drew once per message: orders 0 and 1, other 0.
    assert (brokers[0], queues[0]) == ("broker-b", 0)
    assert (brokers[1], queues[1]) == ("broker-b", 0)
    assert (brokers[2], queues[2]) == ("broker-a", 0)


def test_each_topic_has_its_own_rotation() -> None:
    rotation = Rotation()
    landed: dict[str, list[str]] = {"orders": [], "payments": []}
    for _ in range(8):
        for topic in landed:
            parts = plan_sends([_message(topic)], _layout, _every_broker, Draws(rotation))
            landed[topic] += _brokers(parts)
    assert landed["orders"] == landed["payments"] == ["broker-b", "broker-a"] * 4


def test_a_message_group_keeps_its_queue_and_draws_nothing() -> None:
    rotation = Rotation()
    for _ in range(3):
        parts = plan_sends([_message(group="g1")], _layout, _stale, Draws(rotation))
        [(broker, [(_, message, _)])] = parts.items()
        assert message.queue_id is not None
    assert rotation.draw("orders", 0) == 0  # the counter was never drawn from


def test_sends_steered_off_a_drained_broker_spread_over_the_others_queues() -> None:
    rotation = Rotation()
    queues: Counter[tuple[str, int | None]] = Counter()
    for _ in range(16):
        parts = plan_sends(
            [_message()], _layout, lambda broker: broker != "broker-b", Draws(rotation)
        )
        for broker, part in parts.items():
            queues.update((broker, m.queue_id) for _, m, _ in part)
    assert queues == {("broker-a", 0): 8, ("broker-a", 1): 8}
