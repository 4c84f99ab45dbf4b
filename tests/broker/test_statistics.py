"""Minute buckets over 24 hours: rates, totals, expiry, and the broker feeding them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from halfmoon.broker import FakeClock
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import OutgoingMessage
from halfmoon.broker.statistics import MINUTE_MS, WINDOW_MINUTES, MinuteRing, TrafficStatistics

START = 1_700_000_040_000 // MINUTE_MS * MINUTE_MS  # a minute boundary


def row(stats: TrafficStatistics, topic: str, group: str | None = None):
    return next(r for r in stats.rows(topic=topic) if r.group == group)


def test_rate_is_the_last_sixty_seconds_and_totals_cover_the_day():
    clock = FakeClock(START)
    stats = TrafficStatistics(clock.now_ms)
    stats.record_in(["orders"] * 120)
    clock.advance(30_000)  # half a minute later: all 120 are still within 60 s
    assert row(stats, "orders").per_second == 2.0
    clock.advance(60_000)  # 90 s after: half of the previous minute's share has left
    assert row(stats, "orders").last_minute == 60
    clock.advance(3 * 3600_000)
    r = row(stats, "orders")
    assert (r.per_second, r.total_1h, r.total_24h) == (0.0, 0, 120)


def test_out_rows_are_per_group_and_topic_and_filterable():
    clock = FakeClock(START)
    stats = TrafficStatistics(clock.now_ms)
    stats.record_in(["a", "b", "a"])
    stats.record_out("g1", "a", 2)
    stats.record_out("g2", "a", 1)
    stats.record_out("g2", "b", 0)  # nothing delivered: no series
    rows = stats.rows()
    assert [(r.topic, r.group, r.total_24h) for r in rows] == [
        ("a", None, 2), ("b", None, 1), ("a", "g1", 2), ("a", "g2", 1),
    ]  # fmt: skip
    assert [(r.topic, r.group) for r in stats.rows(group="g2")] == [("a", "g2")]
    assert [(r.topic, r.group) for r in stats.rows(topic="b")] == [("b", None)]


def test_buckets_older_than_the_window_leave_the_total():
    clock = FakeClock(START)
    stats = TrafficStatistics(clock.now_ms)
    stats.record_in(["t"] * 5)
    clock.advance(23 * 3600_000)
    stats.record_in(["t"] * 7)
    assert row(stats, "t").total_24h == 12
    clock.advance(2 * 3600_000)  # the first five are now 25 h old
    assert row(stats, "t").total_24h == 7
    assert stats.per_minute("t", minutes=3) == [0, 0, 0]


def test_idle_series_are_dropped_after_a_whole_window():
    clock = FakeClock(START)
    stats = TrafficStatistics(clock.now_ms)
    stats.record_out("gone", "t", 3)
    clock.advance(WINDOW_MINUTES * MINUTE_MS)
    assert stats.rows() == []


def test_ring_reuses_a_slot_when_its_minute_comes_round():
    ring = MinuteRing(size=4)
    ring.add(1, 5)
    ring.add(5, 2)  # same slot as minute 1, four minutes later
    assert (ring.at(1), ring.at(5), ring.total(5)) == (0, 2, 2)


def test_per_minute_series_is_oldest_first():
    clock = FakeClock(START)
    stats = TrafficStatistics(clock.now_ms)
    stats.record_in(["t"])
    clock.advance(MINUTE_MS)
    stats.record_in(["t", "t"])
    assert stats.per_minute("t", minutes=3) == [0, 1, 2]


def test_the_broker_counts_sends_pops_and_pulls(broker, clock):
    broker.create_topic("orders", queue_count=1)
    broker.create_group("billing", consume_from="earliest")
    broker.send([OutgoingMessage(topic="orders", body=b"x") for _ in range(4)])
    assert len(broker.receive("billing", "orders", FilterSpec(), 3, 60_000)) == 3
    broker.pull("billing", "orders", 0, 0, 2, FilterSpec())
    rows = {(r.topic, r.group): r.total_24h for r in broker.statistics.rows()}
    assert rows == {("orders", None): 4, ("orders", "billing"): 5}


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "total"]),
            st.integers(min_value=-3, max_value=12),  # mostly forward, now and then back
            st.integers(min_value=1, max_value=5),
        ),
        max_size=60,
    )
)
@settings(max_examples=300, deadline=None)
def test_the_running_total_is_the_sum_of_the_buckets_in_the_window(steps):
    """Whatever the order of writes and reads (the clock may even step back), the running
    window total equals the plain sum of the buckets whose minute is in the window."""
    ring = MinuteRing(size=8)
    minute = 100
    for kind, step, count in steps:
        minute = max(0, minute + step)
        if kind == "add":
            ring.add(minute, count)
        else:
            plain = sum(
                c
                for c, m in zip(ring.counts, ring.minutes, strict=True)
                if minute - 8 < m <= minute
            )
            assert ring.total(minute) == plain
            last_three = sum(ring.at(m) for m in range(minute - 2, minute + 1))
            assert ring.total(minute, 3) == last_three


def test_history_sums_steps_per_kind_for_a_topic_and_for_a_group():
    clock = FakeClock(START)
    stats = TrafficStatistics(clock.now_ms)
    stats.record_in(["orders"] * 5)
    stats.record_out("billing", "orders", 4)
    stats.record("acked", "billing", "orders", 3)
    stats.record("redelivered", "billing", "orders", 1)
    stats.record_out("audit", "orders", 2)
    stats.record_in(["other"] * 7)
    clock.advance(MINUTE_MS * 2)
    stats.record_in(["orders"])
    hour = stats.history("orders", None, 60)
    assert hour["minutes"] == 60 and hour["step_ms"] == MINUTE_MS
    assert hour["start_ms"] == START + 2 * MINUTE_MS - 59 * MINUTE_MS
    series = hour["series"]
    assert series["in"][-3:] == [5, 0, 1] and sum(series["in"]) == 6
    assert sum(series["out"]) == 6  # both groups
    assert sum(series["acked"]) == 3 and sum(series["redelivered"]) == 1
    group = stats.history(None, "billing", 60)["series"]
    assert sum(group["out"]) == 4 and sum(group["in"]) == 6  # the topics it consumed
    day = stats.history("orders", None, WINDOW_MINUTES)
    assert day["step_ms"] == 12 * MINUTE_MS and len(day["series"]["in"]) == 120
    assert sum(day["series"]["in"]) == 6


def test_history_forgets_idle_consumption_series():
    clock = FakeClock(START)
    stats = TrafficStatistics(clock.now_ms, window_minutes=10)
    stats.record("acked", "billing", "orders", 3)
    clock.advance(MINUTE_MS * 10)
    assert sum(stats.history("orders", None, 10)["series"]["acked"]) == 0
    assert not stats._consumption  # dropped, not kept at zero
