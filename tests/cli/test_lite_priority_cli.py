"""``halfmoon topic create --type priority|lite``, ``topic lite-list`` and ``topic lite-delete``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from halfmoon.broker.message import MessageType, OutgoingMessage
from tests.cli.admin_harness import AdminServer
from tests.cli.test_cli import failed, halfmoon, ok, unique


@pytest.fixture(scope="module")
def admin(tmp_path_factory) -> Iterator[AdminServer]:
    with AdminServer(tmp_path_factory.mktemp("metadata")) as server:
        yield server


@pytest.mark.parametrize("kind", ["priority", "lite"])
def test_create_priority_and_lite_topics(admin: AdminServer, kind: str) -> None:
    name = unique(kind)
    out = ok(halfmoon("topic", "create", name, "--type", kind, "--queues", "4", admin=admin))
    assert f"created topic '{name}' ({kind}, 4 queues" in out
    topic = json.loads(ok(halfmoon("topic", "describe", name, "--json", admin=admin)))
    assert topic["message_type"] == kind
    route = ok(halfmoon("topic", "route", name, admin=admin))
    assert kind in route


def test_lite_list_and_delete(admin: AdminServer) -> None:
    name = unique("chat")
    ok(halfmoon("topic", "create", name, "--type", "lite", "--queues", "1", admin=admin))
    admin.broker.send(
        [
            OutgoingMessage(name, b"x", message_type=MessageType.LITE, lite_topic=lite)
            for lite in ("s-1", "s-2", "s-1")
        ]
    )
    rows = ok(halfmoon("topic", "lite-list", name, admin=admin))
    assert "s-1" in rows and "s-2" in rows and "2 lite topics" in rows
    answer = json.loads(ok(halfmoon("topic", "lite-list", name, "--json", admin=admin)))
    assert [(t["lite_topic"], t["max_offset"]) for t in answer["lite_topics"]] == [
        ("s-1", 2),
        ("s-2", 1),
    ]
    out = ok(halfmoon("topic", "lite-delete", name, "--lite-topic", "s-1", admin=admin))
    assert "deleted lite topic 's-1'" in out
    answer = json.loads(ok(halfmoon("topic", "lite-list", name, "--json", admin=admin)))
    assert [t["lite_topic"] for t in answer["lite_topics"]] == ["s-2"]


def test_lite_errors_are_one_line(admin: AdminServer) -> None:
    name = unique("chat")
    ok(halfmoon("topic", "create", name, "--type", "lite", admin=admin))
    line = failed(halfmoon("topic", "lite-delete", name, "--lite-topic", "bad name", admin=admin))
    assert line.endswith("(ILLEGAL_LITE_TOPIC)")
    line = failed(halfmoon("topic", "lite-delete", name, "--lite-topic", "never-sent", admin=admin))
    assert "has no lite topic 'never-sent'" in line
    plain = unique("plain")
    ok(halfmoon("topic", "create", plain, admin=admin))
    line = failed(halfmoon("topic", "lite-list", plain, admin=admin))
    assert "not a lite topic" in line
