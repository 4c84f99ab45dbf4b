"""``?namespace=`` on the admin API: names taken in the namespace, lists filtered by it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from halfmoon.config import load_config
from tests.cli.admin_harness import AdminServer


@pytest.fixture
def admin(tmp_path) -> Iterator[AdminServer]:
    config = load_config(env={}, overrides=["broker.default_queue_count=2"])
    with AdminServer(tmp_path / "metadata", config) as server:
        yield server


def created(admin: AdminServer, path: str, body: dict) -> dict:
    status, answer = admin.call("POST", path, body)
    assert status == 201, answer
    return answer


def test_names_in_path_body_and_query_are_taken_in_the_namespace(admin: AdminServer) -> None:
    topic = created(admin, "/v1/topics?namespace=ns", {"name": "orders"})
    group = created(admin, "/v1/groups?namespace=ns", {"name": "billing"})
    # Answers show the stored names, which also work without the parameter.
    assert (topic["name"], group["name"]) == ("ns%orders", "ns%billing")
    assert admin.broker.get_topic("ns%orders").name == "ns%orders"
    assert admin.call("GET", "/v1/topics/orders")[0] == 404
    assert admin.call("GET", "/v1/topics/orders?namespace=ns") == (200, topic)
    assert admin.call("GET", "/v1/topics/ns%25orders")[1]["name"] == "ns%orders"
    assert admin.call("GET", "/v1/topics/orders?namespace=other")[0] == 404

    status, sent = admin.call("POST", "/v1/topics/orders/messages?namespace=ns", {"body": "hello"})
    assert status == 201 and sent["topic"] == "ns%orders", sent
    status, progress = admin.call("GET", "/v1/groups/billing/progress?namespace=ns&topic=orders")
    assert status == 200 and (progress["group"], progress["topic"]) == ("ns%billing", "ns%orders")
    status, reset = admin.call(
        "POST",
        "/v1/groups/billing/reset-offset?namespace=ns",
        {"topic": "orders", "timestamp_ms": 0},
    )
    assert status == 200 and (reset["group"], reset["topic"]) == ("ns%billing", "ns%orders")

    status, updated = admin.call("PATCH", "/v1/groups/billing?namespace=ns", {"fifo": True})
    assert status == 200 and updated["fifo"] is True
    assert admin.call("DELETE", "/v1/topics/orders?namespace=ns") == (200, {"deleted": "ns%orders"})
    assert admin.call("GET", "/v1/topics/ns%25orders")[0] == 404


def test_lists_filter_by_namespace_dead_letter_topics_included(admin: AdminServer) -> None:
    for query in ("", "?namespace=a", "?namespace=b"):
        created(admin, "/v1/topics" + query, {"name": "orders"})
        created(admin, "/v1/groups" + query, {"name": "billing"})
    admin.broker.topics.ensure_dead_letter_topic("a%billing")

    def names(path: str, key: str) -> list[str]:
        status, answer = admin.call("GET", path)
        assert status == 200, answer
        return sorted(e["name"] for e in answer[key])

    assert names("/v1/topics?namespace=a", "topics") == ["%DLQ%a%billing", "a%orders"]
    assert names("/v1/groups?namespace=b", "groups") == ["b%billing"]
    assert names("/v1/topics", "topics") == ["%DLQ%a%billing", "a%orders", "b%orders", "orders"]
    assert names("/v1/groups?namespace=", "groups") == ["a%billing", "b%billing", "billing"]


@pytest.mark.parametrize("bad", ["a%25b", "a%20b", "rmq_sys_x", "x" * 126])
def test_an_illegal_namespace_is_a_400_with_a_stable_code(admin: AdminServer, bad: str) -> None:
    status, answer = admin.call("POST", f"/v1/topics?namespace={bad}", {"name": "orders"})
    assert status == 400
    assert answer["error"]["code"] == "ILLEGAL_NAMESPACE", answer
    assert "namespace" in answer["error"]["message"]
    assert admin.broker.list_topics() == []


def test_a_name_too_long_once_namespaced_is_refused_as_an_illegal_topic(admin: AdminServer) -> None:
    status, answer = admin.call("POST", "/v1/topics?namespace=ns", {"name": "t" * 125})
    assert status == 400 and answer["error"]["code"] == "ILLEGAL_TOPIC", answer
    assert "stored as 'ns%" in answer["error"]["message"]


def test_transaction_group_paths_are_not_consumer_groups(admin: AdminServer) -> None:
    # /v1/transaction-groups/{group} names a transaction group, not a consumer group:
    # the namespace leaves it alone (an unknown one is simply reported as such).
    plain = admin.call("POST", "/v1/transaction-groups/tg-1/commit", {})
    namespaced = admin.call("POST", "/v1/transaction-groups/tg-1/commit?namespace=ns", {})
    assert namespaced == plain
