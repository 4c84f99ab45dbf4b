"""The admin API the dashboard added: searched and paged lists, per-minute traffic,
and resending a dead letter (against a real Broker on a real port)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from halfmoon.broker.dead_letters import write_dead_letter
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.config import load_config
from halfmoon.server.admin_dashboard import FILES, STATIC_DIR
from tests.cli.admin_harness import AdminServer


@pytest.fixture
def admin(tmp_path) -> Iterator[AdminServer]:
    config = load_config(env={}, overrides=["broker.default_queue_count=1"])
    with AdminServer(tmp_path / "metadata", config) as server:
        yield server


def test_topics_are_searched_and_paged_on_the_server(admin):
    for i in range(25):
        admin.broker.create_topic(f"orders-{i:02d}", MessageType.NORMAL, 1)
    admin.broker.create_topic("payments", MessageType.NORMAL, 1)
    status, page = admin.call("GET", "/v1/topics?search=ORDERS&offset=10&limit=10")
    assert status == 200
    assert (page["total"], page["offset"], page["limit"]) == (25, 10, 10)
    assert [t["name"] for t in page["topics"]] == [f"orders-{i:02d}" for i in range(10, 20)]
    status, last = admin.call("GET", "/v1/topics?search=orders&offset=20&limit=10")
    assert [t["name"] for t in last["topics"]] == [f"orders-{i:02d}" for i in range(20, 25)]
    # Without paging parameters the answer is the whole list, as before.
    status, everything = admin.call("GET", "/v1/topics")
    assert set(everything) == {"topics"} and len(everything["topics"]) == 26


def test_groups_are_searched_and_paged_and_bad_paging_is_refused(admin):
    for name in ("billing", "shipping", "audit"):
        admin.broker.create_group(name)
    status, page = admin.call("GET", "/v1/groups?search=ing&limit=1")
    assert status == 200 and page["total"] == 2
    assert [g["name"] for g in page["groups"]] == ["billing"]
    for query in ("limit=0", "limit=1001", "offset=-1", "limit=many"):
        status, answer = admin.call("GET", f"/v1/groups?{query}")
        assert status == 400, query
        assert answer["error"]["code"] == "BAD_REQUEST"


def test_statistics_rows_carry_the_last_hour_per_minute(admin):
    admin.broker.create_topic("metered", MessageType.NORMAL, 1)
    admin.broker.send([OutgoingMessage(topic="metered", body=b"x") for _ in range(4)])
    status, stats = admin.call("GET", "/v1/statistics?topic=metered")
    assert status == 200
    (row,) = stats["rows"]
    assert len(row["last_hour"]) == 60 and row["last_hour"][-1] == 4 and sum(row["last_hour"]) == 4
    # A list needs the rates, not the chart: the same rows without their per-minute counts.
    status, lean = admin.call("GET", "/v1/statistics?topic=metered&last_hour=false")
    assert status == 200
    (lean_row,) = lean["rows"]
    assert set(lean_row) == set(row) - {"last_hour"}
    stable = ("topic", "group", "direction", "total_24h", "total_1h")  # not the rates: time moves
    assert [lean_row[k] for k in stable] == [row[k] for k in stable]


def dead_letter(admin: AdminServer, group: str, topic: str) -> None:
    """What the broker does when ``group`` gives up on the first message of ``topic``."""
    admin.broker.create_topic(topic, MessageType.NORMAL, 1)
    admin.broker.create_group(group)
    admin.broker.send(
        [OutgoingMessage(topic=topic, body=b"poison", tag="t1", keys=["k1"], properties={"a": "b"})]
    )
    stored = admin.broker.store.get(topic, 0, 0, 1).messages[0]
    write_dead_letter(admin.broker.store, admin.broker.topics, group, stored, 16)


def test_a_dead_letter_is_resent_to_its_topic_and_stays(admin):
    dead_letter(admin, "g1", "fragile")
    status, letter = admin.call("GET", "/v1/topics/%25DLQ%25g1/queues/0/offsets/0")
    assert status == 200 and letter["dead_letter_topic"] == "fragile"
    status, resent = admin.call("POST", "/v1/topics/%25DLQ%25g1/queues/0/offsets/0/resend")
    assert status == 201, resent
    assert resent["topic"] == "fragile" and resent["queue_offset"] == 1
    assert resent["resent_from"]["message_id"] == letter["message_id"]
    status, copy = admin.call("GET", "/v1/topics/fragile/queues/0/offsets/1")
    assert (copy["body"], copy["tag"], copy["keys"], copy["properties"]) == (
        "poison",
        "t1",
        ["k1"],
        {"a": "b"},
    )
    assert copy["dead_letter_group"] is None
    assert [q.max_offset for q in admin.broker.topic_status("%DLQ%g1")] == [1]


def test_resend_refuses_what_is_not_a_dead_letter_or_has_nowhere_to_go(admin):
    dead_letter(admin, "g2", "source")
    status, answer = admin.call("POST", "/v1/topics/source/queues/0/offsets/0/resend")
    assert status == 400 and "not a dead letter" in answer["error"]["message"]
    status, answer = admin.call(
        "POST", "/v1/topics/%25DLQ%25g2/queues/0/offsets/0/resend", {"topic": "missing"}
    )
    assert status == 404 and answer["error"]["code"] == "TOPIC_NOT_FOUND"
    status, answer = admin.call(
        "POST", "/v1/topics/%25DLQ%25g2/queues/0/offsets/0/resend", {"other": 1}
    )
    assert status == 400
    status, answer = admin.call("POST", "/v1/topics/%25DLQ%25g2/queues/0/offsets/9/resend")
    assert status == 404
    assert [q.max_offset for q in admin.broker.topic_status("source")] == [1]  # nothing sent


def test_the_dashboard_page_is_served_and_unknown_files_are_not(admin):
    status, _ = admin.call("GET", "/dashboard/dashboard.js")
    assert status == 200
    status, answer = admin.call("GET", "/dashboard/../admin.py")
    assert status == 404


def test_every_script_is_served_loaded_and_small(admin):
    """A script split off dashboard.js is served and loaded by the page, after dashboard.js
    (whose helpers, PAGES and TITLES the others use at load), and none outgrows 600 lines."""
    scripts = sorted(path.name for path in STATIC_DIR.glob("*.js"))
    assert {"dashboard.js", "brokers.js", "topics.js", "messages.js"} <= set(scripts)
    assert set(scripts) <= set(FILES)
    page = (STATIC_DIR / "index.html").read_text()
    loaded = re.findall(r'<script src="/dashboard/([^"]+)"></script>', page)
    assert sorted(loaded) == scripts and loaded[0] == "dashboard.js"
    for name in scripts:
        status, _ = admin.call("GET", f"/dashboard/{name}")
        assert status == 200, name
        assert len((STATIC_DIR / name).read_text().splitlines()) <= 600, name


def test_dead_letter_depth_is_counted_per_group_in_one_answer(admin):
    status, empty = admin.call("GET", "/v1/dead-letters")
    assert (status, empty) == (200, {"total": 0, "groups": []})
    dead_letter(admin, "g3", "t3")
    dead_letter(admin, "g4", "t4")
    stored = admin.broker.store.get("t4", 0, 0, 1).messages[0]
    write_dead_letter(admin.broker.store, admin.broker.topics, "g4", stored, 16)
    status, depths = admin.call("GET", "/v1/dead-letters")
    assert depths["total"] == 3
    assert [(g["group"], g["messages"]) for g in depths["groups"]] == [("g3", 1), ("g4", 2)]


def test_a_message_trace_shows_storage_delivery_ack_and_resend(admin):
    admin.broker.create_topic("traced", MessageType.NORMAL, 1)
    (sent,) = admin.broker.send([OutgoingMessage(topic="traced", body=b"x", keys=["k"])])
    (view,) = admin.broker.receive("readers", "traced", FilterSpec(), 1, 10_000, client_id="c1")
    admin.broker.ack("readers", "traced", view.receipt_handle)
    status, trace = admin.call("GET", f"/v1/messages/{sent.message_id}/trace")
    assert status == 200, trace
    assert [(e["event"], e.get("group"), e.get("attempt")) for e in trace["events"]] == [
        ("stored", None, None),
        ("delivered", "readers", 1),
        ("acked", "readers", 1),
    ]
    assert trace["events"][0]["topic"] == "traced" and trace["events"][1]["client"] == "c1"
    assert [m["topic"] for m in trace["messages"]] == ["traced"]
    assert "body" not in trace["messages"][0]
    # A resent dead letter: the original's trace names the new message, and back.
    dead_letter(admin, "g3", "poisoned")
    status, resent = admin.call("POST", "/v1/topics/%25DLQ%25g3/queues/0/offsets/0/resend")
    status, trace = admin.call("GET", f"/v1/messages/{resent['resent_from']['message_id']}/trace")
    assert trace["events"][-1]["event"] == "resent"
    assert trace["events"][-1]["message_id"] == resent["message_id"]
    status, answer = admin.call("GET", "/v1/messages/no-such-id/trace")
    assert status == 404 and answer["error"]["code"] == "MESSAGE_NOT_FOUND"


def test_the_trace_switch_is_a_topic_setting(admin):
    admin.broker.create_topic("quiet", MessageType.NORMAL, 1)
    status, topic = admin.call("PATCH", "/v1/topics/quiet", {"trace": False})
    assert status == 200 and topic["trace"] is False
    status, answer = admin.call("PATCH", "/v1/topics/quiet", {"trace": "no"})
    assert status == 400
    (sent,) = admin.broker.send([OutgoingMessage(topic="quiet", body=b"x")])
    admin.broker.pull("etl", "quiet", 0, 0, 10, FilterSpec())
    status, trace = admin.call("GET", f"/v1/messages/{sent.message_id}/trace")
    assert [e["event"] for e in trace["events"]] == ["stored"]
