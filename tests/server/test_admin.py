"""The admin HTTP API against a real Broker (in-memory store) on a real port."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.config import load_config
from halfmoon.server.admin_openapi import openapi_document
from tests.cli.admin_harness import AdminServer


@pytest.fixture
def admin(tmp_path) -> Iterator[AdminServer]:
    config = load_config(env={}, overrides=["broker.default_queue_count=3"])
    with AdminServer(tmp_path / "metadata", config) as server:
        yield server


def send(admin: AdminServer, topic: str, count: int, queue_id: int | None = None) -> None:
    admin.broker.send(
        [OutgoingMessage(topic=topic, body=b"x" * 10, queue_id=queue_id) for _ in range(count)]
    )


def error_of(answer) -> tuple[str, str]:
    return answer["error"]["code"], answer["error"]["message"]


# -- topics ------------------------------------------------------------------


def test_topic_create_get_list_update_delete(admin):
    status, topic = admin.call(
        "POST",
        "/v1/topics",
        {"name": "orders", "message_type": "fifo", "queue_count": 4, "perm": "rw"},
    )
    assert status == 201
    assert (topic["name"], topic["message_type"], topic["queue_count"], topic["perm"]) == (
        "orders",
        "fifo",
        4,
        "rw",
    )
    assert admin.broker.get_topic("orders").message_type is MessageType.FIFO

    status, listed = admin.call("GET", "/v1/topics")
    assert status == 200
    assert [t["name"] for t in listed["topics"]] == ["orders"]

    status, got = admin.call("GET", "/v1/topics/orders")
    assert (status, got) == (200, topic)

    status, updated = admin.call("PATCH", "/v1/topics/orders", {"queue_count": 6, "perm": "r"})
    assert status == 200
    assert (updated["queue_count"], updated["perm"]) == (6, "r")
    assert admin.broker.get_topic("orders").queue_count == 6

    status, answer = admin.call("DELETE", "/v1/topics/orders")
    assert (status, answer) == (200, {"deleted": "orders"})
    status, answer = admin.call("GET", "/v1/topics/orders")
    assert status == 404
    assert error_of(answer)[0] == "TOPIC_NOT_FOUND"
    assert "orders" in error_of(answer)[1]


def test_topic_defaults_come_from_the_configuration(admin):
    status, topic = admin.call("POST", "/v1/topics", {"name": "plain"})
    assert status == 201
    assert (topic["message_type"], topic["queue_count"], topic["perm"]) == ("normal", 3, "rw")


def test_duplicate_topic_is_a_conflict(admin):
    assert admin.call("POST", "/v1/topics", {"name": "t"})[0] == 201
    status, answer = admin.call("POST", "/v1/topics", {"name": "t"})
    assert status == 409
    assert error_of(answer)[0] == "TOPIC_EXISTS"


@pytest.mark.parametrize(
    ("body", "code", "fragment"),
    [
        ({}, "BAD_REQUEST", "'name' is required"),
        ({"name": 5}, "BAD_REQUEST", "'name' must be a string"),
        ({"name": "t", "queue_count": "8"}, "BAD_REQUEST", "'queue_count' must be an integer"),
        ({"name": "t", "queue_count": True}, "BAD_REQUEST", "'queue_count' must be an integer"),
        ({"name": "t", "queue_count": 0}, "BAD_REQUEST", "at least 1"),
        ({"name": "t", "message_type": "urgent"}, "BAD_REQUEST", "one of normal, fifo"),
        ({"name": "t", "perm": "x"}, "BAD_REQUEST", "one of rw, r, w"),
        ({"name": "t", "queues": 4}, "BAD_REQUEST", "unknown field(s) 'queues'"),
        ({"name": "%DLQ%mine"}, "ILLEGAL_TOPIC", "reserved"),
        ({"name": "bad name!"}, "ILLEGAL_TOPIC", "illegal topic name"),
    ],
)
def test_bad_topic_requests_are_400_with_a_reason(admin, body, code, fragment):
    status, answer = admin.call("POST", "/v1/topics", body)
    assert status == 400, answer
    assert error_of(answer)[0] == code
    assert fragment in error_of(answer)[1]
    assert admin.broker.list_topics() == []


def test_body_must_be_a_json_object(admin):
    status, answer = admin.call("POST", "/v1/topics", raw=b"{not json")
    assert status == 400
    assert "not valid JSON" in error_of(answer)[1]
    status, answer = admin.call("POST", "/v1/topics", raw=b"[1, 2]")
    assert status == 400
    assert "JSON object" in error_of(answer)[1]


def test_update_needs_a_change_and_an_existing_topic(admin):
    admin.call("POST", "/v1/topics", {"name": "t"})
    status, answer = admin.call("PATCH", "/v1/topics/t", {})
    assert status == 400
    assert "nothing to change" in error_of(answer)[1]
    status, answer = admin.call("PATCH", "/v1/topics/missing", {"queue_count": 2})
    assert status == 404
    assert error_of(answer)[0] == "TOPIC_NOT_FOUND"
    status, answer = admin.call("DELETE", "/v1/topics/missing")
    assert status == 404


def test_topic_status_reports_offsets_per_queue(admin):
    admin.call("POST", "/v1/topics", {"name": "orders", "queue_count": 2})
    send(admin, "orders", 3, queue_id=0)
    send(admin, "orders", 1, queue_id=1)
    status, answer = admin.call("GET", "/v1/topics/orders/status")
    assert status == 200
    queues = {q["queue_id"]: q for q in answer["queues"]}
    assert set(queues) == {0, 1}
    assert (queues[0]["min_offset"], queues[0]["max_offset"]) == (0, 3)
    assert (queues[1]["min_offset"], queues[1]["max_offset"]) == (0, 1)
    assert isinstance(queues[0]["last_store_timestamp"], int)
    assert admin.call("GET", "/v1/topics/nope/status")[0] == 404


def test_dead_letter_topic_names_travel_percent_encoded(admin):
    admin.broker.topics.ensure("%DLQ%g1", MessageType.NORMAL, 1)
    status, topic = admin.call("GET", "/v1/topics/%25DLQ%25g1")
    assert status == 200
    assert topic["name"] == "%DLQ%g1"
    status, answer = admin.call("GET", "/v1/topics/%25DLQ%25g1/status")
    assert status == 200
    assert answer["topic"] == "%DLQ%g1"


# -- groups ------------------------------------------------------------------


def test_group_create_get_list_update_delete(admin):
    status, group = admin.call(
        "POST",
        "/v1/groups",
        {
            "name": "billing",
            "fifo": True,
            "max_delivery_attempts": 5,
            "consume_from": "earliest",
            "retry_policy": {
                "kind": "exponential",
                "initial_ms": 100,
                "max_ms": 10_000,
                "multiplier": 3,
            },
        },
    )
    assert status == 201
    assert (group["fifo"], group["max_delivery_attempts"], group["consume_from"]) == (
        True,
        5,
        "earliest",
    )
    assert group["retry_policy"]["kind"] == "exponential"
    assert admin.broker.get_group("billing").retry_policy.delay_for_attempt(2) == 300

    assert [g["name"] for g in admin.call("GET", "/v1/groups")[1]["groups"]] == ["billing"]
    assert admin.call("GET", "/v1/groups/billing") == (200, group)

    status, updated = admin.call(
        "PATCH",
        "/v1/groups/billing",
        {"consume_enabled": False, "retry_policy": {"kind": "customized", "levels_ms": [10, 20]}},
    )
    assert status == 200
    assert updated["consume_enabled"] is False
    assert updated["retry_policy"]["levels_ms"] == [10, 20]

    assert admin.call("DELETE", "/v1/groups/billing") == (200, {"deleted": "billing"})
    status, answer = admin.call("GET", "/v1/groups/billing")
    assert status == 404
    assert error_of(answer)[0] == "CONSUMER_GROUP_NOT_FOUND"


def test_reading_a_missing_group_does_not_create_it(admin):
    assert admin.broker.config.auto_create_groups
    assert admin.call("GET", "/v1/groups/ghost")[0] == 404
    assert admin.call("GET", "/v1/groups/ghost/progress")[0] == 404
    assert admin.broker.list_groups() == []


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"name": "g", "fifo": "yes"}, "'fifo' must be true or false"),
        ({"name": "g", "max_delivery_attempts": 0}, "at least 1"),
        ({"name": "g", "consume_from": "middle"}, "one of latest, earliest"),
        (
            {"name": "g", "retry_policy": {"kind": "customized", "levels_ms": ["1s"]}},
            "array of integers",
        ),
        ({"name": "g", "retry_policy": {"kind": "exponential"}}, "'initial_ms' is required"),
        ({"name": "g", "max_attempts": 3}, "unknown field(s) 'max_attempts'"),
    ],
)
def test_bad_group_requests_are_400(admin, body, fragment):
    status, answer = admin.call("POST", "/v1/groups", body)
    assert status == 400, answer
    assert fragment in error_of(answer)[1]


def test_group_name_too_long_for_its_dead_letter_topic_is_refused(admin):
    status, answer = admin.call("POST", "/v1/groups", {"name": "g" * 121})
    assert status == 400, answer
    code, text = error_of(answer)
    assert code == "ILLEGAL_CONSUMER_GROUP"
    assert "at most 120" in text and "%DLQ%" in text
    assert admin.call("GET", "/v1/groups")[1]["groups"] == []
    assert admin.call("POST", "/v1/groups", {"name": "g" * 120})[0] == 201


def test_duplicate_group_is_a_conflict(admin):
    assert admin.call("POST", "/v1/groups", {"name": "g"})[0] == 201
    status, answer = admin.call("POST", "/v1/groups", {"name": "g"})
    assert status == 409
    assert error_of(answer)[0] == "CONSUMER_GROUP_EXISTS"


def test_group_progress_shows_lag_and_inflight_per_queue(admin):
    admin.call("POST", "/v1/topics", {"name": "orders", "queue_count": 1})
    admin.call("POST", "/v1/groups", {"name": "g", "consume_from": "earliest"})
    send(admin, "orders", 5)
    views = admin.broker.receive("g", "orders", FilterSpec(), 3, 60_000)
    assert len(views) == 3
    admin.broker.ack("g", "orders", views[0].receipt_handle)

    status, answer = admin.call("GET", "/v1/groups/g/progress?topic=orders")
    assert status == 200
    assert answer["group"] == "g"
    (queue,) = answer["queues"]
    assert (queue["topic"], queue["queue_id"], queue["max_offset"]) == ("orders", 0, 5)
    assert queue["committed_offset"] == 1
    assert queue["lag"] == 4
    assert queue["inflight"] == 2
    assert queue["retrying"] == 0  # each delivered once
    # Without ?topic the answer covers every topic the group consumed.
    assert admin.call("GET", "/v1/groups/g/progress")[1]["queues"] == [queue]
    status, answer = admin.call("GET", "/v1/groups/g/progress?topic=nope")
    assert status == 404
    assert error_of(answer)[0] == "TOPIC_NOT_FOUND"


# -- status, config, errors ---------------------------------------------------


def test_status_counts_topics_groups_and_messages(admin):
    admin.call("POST", "/v1/topics", {"name": "a"})
    admin.call("POST", "/v1/groups", {"name": "g"})
    send(admin, "a", 4)
    status, answer = admin.call("GET", "/v1/status")
    assert status == 200
    assert (answer["topics"], answer["groups"], answer["messages_in_total"]) == (1, 1, 4)
    assert answer["name"] == "halfmoon"


def test_config_endpoint_shows_the_running_configuration(admin):
    status, answer = admin.call("GET", "/v1/config")
    assert status == 200
    assert answer["broker"]["default_queue_count"] == 3
    assert set(answer) == {
        "store",
        "broker",
        "server",
        "transaction",
        "auth",
        "tls",
        "etcd",
        "cluster",
        "replication",
        "internal",
        "log",
    }


def test_unknown_endpoint_and_method_answer_json_errors(admin):
    status, answer = admin.call("GET", "/v1/nothing")
    assert status == 404
    assert error_of(answer)[0] == "NOT_FOUND"
    status, answer = admin.call("PUT", "/v1/topics")
    assert status == 405
    assert error_of(answer)[0] == "METHOD_NOT_ALLOWED"


def test_healthz(admin):
    assert admin.call("GET", "/healthz") == (200, {"status": "ok"})


# -- OpenAPI -----------------------------------------------------------------


def test_openapi_describes_every_route(admin):
    status, document = admin.call("GET", "/openapi.json")
    assert status == 200
    assert document["openapi"].startswith("3.")
    served = set()
    from halfmoon.server.admin import create_admin_app

    app = create_admin_app(admin.broker, admin.config, registry=admin.registry)
    for route in app.router.routes():
        if route.method != "HEAD":
            served.add((route.resource.canonical, route.method.lower()))
    documented = {(path, method) for path, ops in document["paths"].items() for method in ops}
    assert served == documented


def test_openapi_document_is_valid_openapi_3():
    validator = pytest.importorskip(
        "openapi_spec_validator", reason="openapi-spec-validator is not installed"
    )
    validator.validate(openapi_document())


# -- metrics -----------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def scrape(admin: AdminServer) -> dict[str, float]:
    status, text = admin.call("GET", "/metrics")
    assert status == 200
    samples = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = _SAMPLE.match(line)
        assert match, f"not Prometheus text: {line!r}"
        samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


def test_metrics_expose_offsets_lag_status_and_requests(admin):
    admin.call("POST", "/v1/topics", {"name": "orders", "queue_count": 1})
    admin.call("POST", "/v1/groups", {"name": "g", "consume_from": "earliest"})
    send(admin, "orders", 7)
    views = admin.broker.receive("g", "orders", FilterSpec(), 2, 60_000)
    for view in views:
        admin.broker.ack("g", "orders", view.receipt_handle)

    samples = scrape(admin)
    assert samples['halfmoon_queue_max_offset{topic="orders",queue="0"}'] == 7
    assert samples['halfmoon_queue_min_offset{topic="orders",queue="0"}'] == 0
    assert samples['halfmoon_group_lag{group="g",topic="orders",queue="0"}'] == 5
    assert samples['halfmoon_group_inflight{group="g",topic="orders",queue="0"}'] == 0
    assert samples["halfmoon_broker_messages_in_total"] == 7
    assert samples["halfmoon_broker_topics"] == 1
    # The message trace: 2 deliveries and 2 acks, recorded (buffered until the next tick).
    assert (
        samples["halfmoon_broker_trace_events_total"] + samples["halfmoon_broker_trace_buffered"]
        == 4
    )
    assert samples["halfmoon_broker_trace_dropped_total"] == 0
    assert (
        samples['halfmoon_admin_requests_total{method="POST",route="/v1/topics",status="201"}'] == 1
    )


def test_metrics_content_type_is_prometheus_text(admin):
    import urllib.request

    with urllib.request.urlopen(admin.url + "/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
