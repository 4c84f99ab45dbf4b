"""The charts: axes with units, time labels, values on hover, and the Topic and Consumer
group pages' rate charts (in, out, acked, redelivered) over a chosen range, through
chromium against a real ``halfmoon serve`` with real consumption behind the figures."""

from __future__ import annotations

import re
import time

from halfmoon.client.selector import MessageSelector
from halfmoon.client.sync import SyncSimpleConsumer
from tests.dashboard.test_pages import api, send, unique
from tests.server.conftest import wait_until

CLOCK = re.compile(r"^\d\d:\d\d$")


def consume_with_one_retry(server, group: str, topic: str, count: int) -> None:
    """Receive ``count`` messages; let one come back once (not acked, a 1 s invisibility),
    then ack every one: ``count`` + 1 deliveries, 1 redelivered, ``count`` acked."""
    with SyncSimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer:
        first: list = []
        deadline = time.monotonic() + 30
        while len(first) < count and time.monotonic() < deadline:
            first += consumer.receive(count - len(first), 30, wait=2)
        assert len(first) == count
        retried, *rest = first
        consumer.change_invisible_duration(retried, 1)  # back in a second
        for message in rest:
            consumer.ack(message)
        again: list = []
        deadline = time.monotonic() + 30
        while not again and time.monotonic() < deadline:
            again = consumer.receive(1, 30, wait=2)
        assert again and again[0].delivery_attempt == 2, again
        consumer.ack(again[0])


def hover_values(page, section: str) -> list[str]:
    """The tooltip's lines at the last two steps of the chart in ``section`` (the figures
    are in the current minute's step, or the one before when a minute just turned)."""
    area = page.locator(f"{section} rect.hover")
    box = area.bounding_box()
    lines: list[str] = []
    for x in (box["width"] - 1, box["width"] * (1 - 1 / 120) - 2):
        area.hover(position={"x": x, "y": box["height"] / 2})
        tip = page.locator(f"{section} .chart-tip")
        tip.wait_for(state="visible")
        lines += tip.locator(".value").all_inner_texts()
    return lines


def shown(lines: list[str], name: str) -> float:
    values = [float(line.split(": ")[1].split()[0]) for line in lines if line.startswith(name)]
    assert values, (name, lines)
    return max(values)


def test_overview_chart_has_axes_units_time_labels_and_hover_values(dashboard, server):
    topic = unique("charted")
    server.create_topic(topic, queues=1)
    for i in range(5):
        send(server, topic, f"m{i}")
    page = dashboard.open("overview", "overview")
    chart = page.locator("main svg.chart")
    assert chart.locator("text.unit").text_content() == "msg/min"
    labels = chart.locator("text.tick.x").all_text_contents()
    assert len(labels) >= 2 and all(CLOCK.match(t) for t in labels), labels
    ticks = [float(t) for t in chart.locator("text.tick.y").all_text_contents()]
    assert ticks[0] == 0 and ticks[-1] >= 5, ticks  # the axis reaches the peak
    assert "times " in page.locator("main .chart-box .muted").inner_text()  # the zone named
    lines = hover_values(page, "main section:has(svg.chart)")
    assert shown(lines, "in") >= 5, lines
    when = page.locator("main .chart-tip .when").inner_text()
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ – \d\d:\d\d$", when), when


def test_group_and_topic_rate_charts_show_acked_and_redelivered_over_a_range(dashboard, server):
    topic, group = unique("rated"), unique("rater")
    server.create_topic(topic, queues=1)
    server.create_group(group)
    for i in range(6):
        send(server, topic, f"r{i}")
    consume_with_one_retry(server, group, topic, 6)
    history = api(server, "GET", f"/v1/statistics/history?group={group}")
    sums = {kind: sum(values) for kind, values in history["series"].items()}
    assert sums == {"in": 6, "out": 7, "acked": 6, "redelivered": 1}, sums

    page = dashboard.open(f"group?name={group}", "group")
    legend = page.locator("#rates .legend").inner_text()
    for name in ("in", "out (delivered)", "acked", "redelivered"):
        assert name in legend, legend
    assert page.locator("#rates text.unit").text_content() == "msg/s"
    lines = hover_values(page, "#rates")
    # Per second, over a minute: the busier of the last two minutes (the six acks can straddle a
    # minute's turn on a loaded machine; the sums above hold all of them).
    acked = api(server, "GET", f"/v1/statistics/history?group={group}")["series"]["acked"][-2:]
    assert abs(shown(lines, "acked") - max(acked) / 60) < 0.001, (lines, acked)
    assert shown(lines, "redelivered") > 0, lines
    page.select_option("#rate-range", "1440")
    page.wait_for_selector("#rates .muted:has-text('last 24 hours')")
    assert "averaged over 12 minutes" in page.locator("#rates .chart-box .muted").inner_text()
    lines = hover_values(page, "#rates")
    assert shown(lines, "acked") > 0, lines
    dashboard.screenshot("group-rates")
    # The choice survives the page's own refresh (it redraws the chart every 5 s).
    drawn = int(page.locator("main").get_attribute("data-drawn"))
    wait_until(
        lambda: int(page.locator("main").get_attribute("data-drawn")) > drawn, 30, "a refresh"
    )
    assert page.locator("#rate-range").input_value() == "1440"

    page = dashboard.open(f"topic?name={topic}", "topic")
    lines = hover_values(page, "#rates")
    topic_history = api(server, "GET", f"/v1/statistics/history?topic={topic}")["series"]
    busiest = {kind: max(values[-2:]) for kind, values in topic_history.items()}
    assert abs(shown(lines, "in") - busiest["in"] / 60) < 0.001, (lines, busiest)
    assert abs(shown(lines, "out (delivered)") - busiest["out"] / 60) < 0.001, (lines, busiest)
