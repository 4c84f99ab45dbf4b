"""The placement rule, on its own: spread, pinned, dense per-broker queue ids, refusals."""

from __future__ import annotations

from collections import Counter

import pytest

from halfmoon.cluster.coordination.placement import ClusterTopic, grow_queues, place_queues
from halfmoon.cluster.errors import NoLiveBrokers


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


def test_growing_keeps_existing_queues_and_spreads_new_ones_over_live_brokers() -> None:
    topic = ClusterTopic("t", place_queues("t", 2, {"a"}))
    grown = grow_queues(topic, 5, {"a", "b"})
    assert grown.queues[:2] == topic.queues
    assert [q.queue_id for q in grown.queues] == [0, 1, 2, 3, 4]
    assert {q.broker for q in grown.queues[2:]} == {"a", "b"}
    for broker in ("a", "b"):  # each broker's own queue ids stay dense
        assert [q.broker_queue for q in grown.queues_on(broker)] == list(
            range(len(grown.queues_on(broker)))
        )
    assert grown.writable == 5 and grown.write_queues is None


def test_shrinking_only_lowers_the_writable_count_and_survives_a_round_trip() -> None:
    topic = ClusterTopic("t", place_queues("t", 4, {"a", "b"}))
    shrunk = grow_queues(topic, 1, {"a", "b"})
    assert shrunk.queues == topic.queues and shrunk.writable == 1
    assert ClusterTopic.from_json(shrunk.to_json()) == shrunk
    assert grow_queues(shrunk, 4, {"a"}).write_queues is None
    assert "write_queues" not in topic.to_json()
