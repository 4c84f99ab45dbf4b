"""The placement rule, on its own: spread, pinned, dense per-broker queue ids, refusals."""

from __future__ import annotations

from collections import Counter

import pytest

from halfmoon.cluster.errors import NoLiveBrokers
from halfmoon.cluster.placement import ClusterTopic, place_queues


def test_spread_places_queues_evenly_over_every_live_broker() -> None:
    queues = place_queues("orders", 8, {"a", "b", "c"})
    assert [q.queue_id for q in queues] == list(range(8))
    assert sorted(Counter(q.broker for q in queues).values()) == [2, 3, 3]
    for broker in "abc":
        assert [q.broker_queue for q in queues if q.broker == broker] == list(
            range(sum(q.broker == broker for q in queues))
        )


def test_spread_is_deterministic_and_starts_at_different_brokers_for_different_topics() -> None:
    assert place_queues("orders", 4, ["b", "a"]) == place_queues("orders", 4, {"a", "b"})
    starts = {place_queues(f"t{i}", 1, {"a", "b", "c"})[0].broker for i in range(30)}
    assert starts == {"a", "b", "c"}


def test_pinned_uses_only_the_named_brokers_in_the_order_given() -> None:
    queues = place_queues("orders", 5, {"a", "b", "c"}, ["c", "a", "c"])
    assert [q.broker for q in queues] == ["c", "a", "c", "a", "c"]
    assert [q.broker_queue for q in queues] == [0, 0, 1, 1, 2]


def test_placement_needs_live_brokers() -> None:
    with pytest.raises(NoLiveBrokers) as caught:
        place_queues("orders", 8, set())
    assert caught.value.code == "NO_LIVE_BROKERS"
    with pytest.raises(NoLiveBrokers, match="gone"):
        place_queues("orders", 8, {"a"}, ["a", "gone"])


def test_a_topic_record_round_trips_through_json() -> None:
    topic = ClusterTopic("orders", place_queues("orders", 3, {"a", "b"}), "fifo", "r", 12)
    assert ClusterTopic.from_json(topic.to_json()) == topic
    assert topic.brokers == ["a", "b"]
    assert sum(len(topic.queues_on(b)) for b in topic.brokers) == 3
    with pytest.raises(ValueError):
        ClusterTopic.from_json({"name": "orders", "queues": [{"broker": "a"}]})
