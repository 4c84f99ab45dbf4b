"""``--namespace`` (and $HALFMOON_NAMESPACE) on the admin commands, as a user runs them."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from halfmoon.broker.message import OutgoingMessage
from tests.cli.admin_harness import AdminServer
from tests.cli.test_cli import failed, halfmoon, ok, table


@pytest.fixture
def admin(tmp_path) -> Iterator[AdminServer]:
    with AdminServer(tmp_path / "metadata") as server:
        yield server


def test_topic_and_group_commands_take_names_in_the_namespace(admin: AdminServer) -> None:
    out = ok(
        halfmoon("topic", "create", "orders", "--queues", "2", "--namespace", "ns", admin=admin)
    )
    assert "'ns%orders'" in out
    ok(halfmoon("group", "create", "billing", "--namespace", "ns", admin=admin))
    ok(halfmoon("topic", "create", "orders", "--queues", "1", admin=admin))  # the bare name is free
    assert admin.broker.get_topic("ns%orders").queue_count == 2
    assert admin.broker.get_topic("orders").queue_count == 1
    assert admin.broker.get_group("ns%billing").name == "ns%billing"

    admin.broker.send([OutgoingMessage(topic="ns%orders", body=b"x", queue_id=1)])
    described = json.loads(
        ok(halfmoon("topic", "describe", "orders", "--namespace", "ns", "--json", admin=admin))
    )
    assert described["name"] == "ns%orders"
    assert [q["max_offset"] for q in described["queues"]] == [0, 1]

    rows = table(ok(halfmoon("topic", "list", "--namespace", "ns", admin=admin)))
    assert [r[0] for r in rows[1:]] == ["ns%orders"]
    groups = json.loads(ok(halfmoon("group", "list", "--namespace", "ns", "--json", admin=admin)))
    assert [g["name"] for g in groups["groups"]] == ["ns%billing"]

    ok(halfmoon("topic", "delete", "orders", "--namespace", "ns", admin=admin))
    assert [t.name for t in admin.broker.list_topics()] == ["orders"]


def test_the_namespace_can_come_from_the_environment(admin: AdminServer) -> None:
    env = {"HALFMOON_NAMESPACE": "tenant"}
    ok(halfmoon("topic", "create", "events", admin=admin, env=env))
    assert admin.broker.get_topic("tenant%events").name == "tenant%events"
    # --namespace wins over the environment.
    ok(halfmoon("topic", "create", "events", "--namespace", "other", admin=admin, env=env))
    assert admin.broker.get_topic("other%events").name == "other%events"


def test_an_illegal_namespace_is_one_line_with_its_code(admin: AdminServer) -> None:
    line = failed(halfmoon("topic", "create", "orders", "--namespace", "a%b", admin=admin))
    assert "illegal namespace 'a%b'" in line and line.endswith("(ILLEGAL_NAMESPACE)")
    assert admin.broker.list_topics() == []
