"""``halfmoon stats`` end to end: traffic the broker counted, per topic and group."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import OutgoingMessage
from tests.cli.admin_harness import AdminServer
from tests.cli.test_cli import failed, failed_json, halfmoon, ok, table, unique


@pytest.fixture
def admin(tmp_path) -> Iterator[AdminServer]:
    # One server per test: the statistics are process-wide counters.
    with AdminServer(tmp_path / "metadata") as server:
        yield server


def test_no_traffic_says_so(admin):
    assert ok(halfmoon("stats", admin=admin)) == "no traffic in the last 24 hours\n"
    assert json.loads(ok(halfmoon("stats", "--json", admin=admin)))["rows"] == []


def test_in_and_out_per_topic_and_group_with_lag(admin):
    topic, other, group = unique("orders"), unique("audit"), unique("billing")
    admin.broker.create_topic(topic, queue_count=1)
    admin.broker.create_topic(other, queue_count=1)
    admin.broker.create_group(group, consume_from="earliest")
    admin.broker.send([OutgoingMessage(topic=topic, body=b"x") for _ in range(10)])
    admin.broker.send([OutgoingMessage(topic=other, body=b"y") for _ in range(3)])
    views = admin.broker.receive(group, topic, FilterSpec(), 4, 60_000)
    for view in views:
        admin.broker.ack(group, topic, view.receipt_handle)

    out = ok(halfmoon("stats", admin=admin))
    rows = table(out)
    assert rows[0] == [
        "TOPIC",
        "GROUP",
        "DIRECTION",
        "PER",
        "SECOND",
        "LAST",
        "HOUR",
        "LAST",
        "24H",
        "LAG",
    ]
    by_key = {(r[0], r[1]): r for r in rows[1:-1] if len(r) > 2}
    # The rate is the last 60 s over 60: 10/60 and 4/60, a little less across a minute boundary.
    assert by_key[(topic, "-")][2] == "in" and by_key[(topic, "-")][4:] == ["10", "10", "-"]
    assert 0.15 <= float(by_key[(topic, "-")][3]) <= 0.17
    assert by_key[(topic, group)][2] == "out" and by_key[(topic, group)][4:] == ["4", "4", "6"]
    assert 0.05 <= float(by_key[(topic, group)][3]) <= 0.07
    assert out.rstrip().endswith("last 24h: 13 in, 4 out")

    data = json.loads(ok(halfmoon("stats", "--group", group, "--json", admin=admin)))
    assert [
        (r["topic"], r["group"], r["direction"], r["total_24h"], r["lag"]) for r in data["rows"]
    ] == [(topic, group, "out", 4, 6)]
    data = json.loads(ok(halfmoon("stats", "--topic", other, "--json", admin=admin)))
    assert [(r["topic"], r["direction"], r["total_24h"]) for r in data["rows"]] == [
        (other, "in", 3)
    ]


def test_unknown_topic_or_group_is_one_line(admin):
    assert failed(halfmoon("stats", "--topic", "nope", admin=admin)).endswith("(TOPIC_NOT_FOUND)")
    error = failed_json(halfmoon("stats", "--group", "ghost", "--json", admin=admin))
    assert error["code"] == "CONSUMER_GROUP_NOT_FOUND"
