"""The Prometheus text registry: rendering, labels, escaping, failing collectors."""

from __future__ import annotations

import math

import pytest

from halfmoon.metrics import MetricFamily, MetricsRegistry, render_families


def test_counter_and_gauge_render_with_help_type_and_labels():
    registry = MetricsRegistry()
    sent = registry.counter("halfmoon_sent_total", "Messages sent.", ("topic",))
    sent.inc(topic="orders")
    sent.inc(2, topic="orders")
    sent.inc(topic="audit")
    depth = registry.gauge("halfmoon_depth", "Queue depth.")
    depth.set(7)
    depth.dec(2)

    text = registry.render()
    assert text.endswith("\n")
    lines = text.splitlines()
    assert "# HELP halfmoon_sent_total Messages sent." in lines
    assert "# TYPE halfmoon_sent_total counter" in lines
    assert 'halfmoon_sent_total{topic="audit"} 1' in lines
    assert 'halfmoon_sent_total{topic="orders"} 3' in lines
    assert "# TYPE halfmoon_depth gauge" in lines
    assert "halfmoon_depth 5" in lines
    assert sent.value(topic="orders") == 3


def test_counters_only_go_up_and_labels_must_match():
    registry = MetricsRegistry()
    counter = registry.counter("c_total", "c", ("a",))
    with pytest.raises(ValueError, match="cannot go down"):
        counter.inc(-1, a="x")
    with pytest.raises(ValueError, match="takes labels"):
        counter.inc(b="x")
    with pytest.raises(ValueError, match="illegal metric name"):
        registry.counter("bad-name", "x")
    with pytest.raises(ValueError, match="illegal label name"):
        registry.gauge("g", "x", ("__reserved",))


def test_registering_twice_returns_the_same_metric_unless_it_differs():
    registry = MetricsRegistry()
    first = registry.counter("x_total", "x", ("a",))
    assert registry.counter("x_total", "x", ("a",)) is first
    with pytest.raises(ValueError, match="already registered"):
        registry.gauge("x_total", "x", ("a",))
    with pytest.raises(ValueError, match="already registered"):
        registry.counter("x_total", "x", ("b",))


def test_label_values_and_help_are_escaped():
    text = render_families(
        [MetricFamily("m", "gauge", "help with \\ and\nnewline").add(1, name='a"b\\c\nd')]
    )
    assert "# HELP m help with \\\\ and\\nnewline" in text
    assert 'm{name="a\\"b\\\\c\\nd"} 1' in text


def test_special_numbers():
    text = render_families(
        [
            MetricFamily("m", "gauge", "h")
            .add(math.inf, k="a")
            .add(-math.inf, k="b")
            .add(math.nan, k="c")
            .add(0.25, k="d")
        ]
    )
    assert 'm{k="a"} +Inf' in text
    assert 'm{k="b"} -Inf' in text
    assert 'm{k="c"} NaN' in text
    assert 'm{k="d"} 0.25' in text


def test_collected_families_merge_under_one_header():
    registry = MetricsRegistry()
    registry.add_collector(lambda: [MetricFamily("lag", "gauge", "Lag.").add(1, q="0")])
    registry.add_collector(lambda: [MetricFamily("lag", "gauge", "Lag.").add(2, q="1")])
    text = registry.render()
    assert text.count("# TYPE lag gauge") == 1
    assert 'lag{q="0"} 1' in text and 'lag{q="1"} 2' in text


def test_a_failing_collector_is_skipped_and_counted():
    registry = MetricsRegistry()

    def broken():
        raise RuntimeError("source gone")

    registry.add_collector(broken)
    registry.add_collector(lambda: [MetricFamily("alive", "gauge", "Still here.").add(1)])
    text = registry.render()
    assert "alive 1" in text.splitlines()
    assert "halfmoon_metrics_collector_errors_total 1" in text.splitlines()
    registry.remove_collector(broken)
    assert "halfmoon_metrics_collector_errors_total 1" in registry.render().splitlines()


def test_histogram_renders_cumulative_buckets_sum_and_count():
    registry = MetricsRegistry()
    latency = registry.histogram("h_seconds", "Latency.", ("method",), buckets=(0.1, 1))
    for seconds in (0.05, 0.1, 0.5, 3):
        latency.observe(seconds, method="Send")
    lines = registry.render().splitlines()
    assert "# TYPE h_seconds histogram" in lines
    assert 'h_seconds_bucket{method="Send",le="0.1"} 2' in lines
    assert 'h_seconds_bucket{method="Send",le="1"} 3' in lines
    assert 'h_seconds_bucket{method="Send",le="+Inf"} 4' in lines
    assert 'h_seconds_sum{method="Send"} 3.65' in lines
    assert 'h_seconds_count{method="Send"} 4' in lines
    assert latency.count(method="Send") == 4
    with pytest.raises(ValueError, match="ascending"):
        registry.histogram("bad_seconds", "x", buckets=(1, 0.5))
