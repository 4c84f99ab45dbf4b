"""``halfmoon cluster ...`` and ``halfmoon topic status|route`` end to end against a real admin
API."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from halfmoon.broker.message import OutgoingMessage
from tests.cli.admin_harness import AdminServer
from tests.cli.test_cli import failed, halfmoon, ok, table, unique


@pytest.fixture(scope="module")
def admin(tmp_path_factory) -> Iterator[AdminServer]:
    with AdminServer(tmp_path_factory.mktemp("metadata")) as server:
        yield server


def test_cluster_list_names_the_broker_and_its_addresses(admin):
    rows = table(ok(halfmoon("cluster", "list", admin=admin)))
    assert rows[0][:6] == ["CLUSTER", "BROKER", "ROLE", "GRPC", "ADMIN", "VERSION"]
    assert rows[1][:5] == ["halfmoon", "halfmoon", "master", admin.config.server.listen, admin.url]
    data = json.loads(ok(halfmoon("cluster", "list", "--json", admin=admin)))
    assert data["cluster"] == "halfmoon"
    assert [(b["broker"], b["grpc"], b["admin"]) for b in data["brokers"]] == [
        ("halfmoon", admin.config.server.listen, admin.url)
    ]


def test_cluster_status_shows_the_numbers_operators_watch(admin):
    topic = unique("watched")
    admin.broker.create_topic(topic, queue_count=1)
    admin.broker.send([OutgoingMessage(topic=topic, body=b"x") for _ in range(5)])
    out = ok(halfmoon("cluster", "status", admin=admin))
    lines = out.splitlines()
    assert lines[0].split() == ["broker:", "halfmoon"]
    assert [line.split(":")[0] for line in lines[1:4]] == ["uptime", "in/s", "out/s"]
    assert any(line.startswith("pending transactions:") for line in lines)
    data = json.loads(ok(halfmoon("cluster", "status", "--json", admin=admin)))
    assert data["messages_in_total"] >= 5
    assert data["pending_transactions"] == 0
    assert {"tps_in", "tps_out", "disk_bytes", "unflushed_bytes", "topics", "groups"} <= set(data)


def test_config_get_lists_runtime_keys_and_one_value(admin):
    rows = table(ok(halfmoon("cluster", "config", "get", admin=admin)))
    assert rows[0] == ["KEY", "VALUE", "DESCRIPTION"]
    keys = {r[0]: r[1] for r in rows[1:]}
    assert keys["broker.default_queue_count"] == str(admin.broker.config.default_queue_count)
    assert "broker.timer_window_ms" not in keys  # needs a restart
    out = ok(halfmoon("cluster", "config", "get", "broker.auto_create_groups", admin=admin))
    assert out == ("yes\n" if admin.broker.config.auto_create_groups else "no\n")
    data = json.loads(ok(halfmoon("cluster", "config", "get", "--json", admin=admin)))
    assert {k["key"] for k in data["keys"]} == set(keys)


def test_config_set_takes_effect_at_once(admin):
    topic = unique("small")
    admin.broker.create_topic(topic, queue_count=1)
    before = admin.broker.config.max_body_size
    try:
        out = ok(
            halfmoon(
                "cluster",
                "config",
                "set",
                "broker.max_body_size=16",
                "broker.default_queue_count=3",
                admin=admin,
            )
        )
        assert out.splitlines() == [
            "set broker.default_queue_count = 3 (until restart)",
            "set broker.max_body_size = 16 B (until restart)",
        ]
        assert admin.broker.config.max_body_size == 16
        line = failed(halfmoon("message", "send", topic, "--body", "x" * 17, admin=admin))
        assert line.endswith("(MESSAGE_BODY_TOO_LARGE)")
        data = json.loads(
            ok(
                halfmoon(
                    "cluster", "config", "set", "broker.max_body_size=4MiB", "--json", admin=admin
                )
            )
        )
        assert data["changed"] == ["broker.max_body_size"]
        assert admin.broker.config.max_body_size == 4 * 1024 * 1024
        ok(halfmoon("message", "send", topic, "--body", "x" * 17, admin=admin))
    finally:
        admin.broker.config.max_body_size = before


@pytest.mark.parametrize(
    ("assignment", "fragment"),
    [
        ("broker.timer_window_ms=1h", "cannot be changed while running (it needs a restart)"),
        ("broker.nope=1", "cannot be changed while running (no such key)"),
        ("broker.default_queue_count=many", "bad value 'many' for broker.default_queue_count"),
        ("broker.default_queue_count=0", "must be at least 1"),
    ],
)
def test_config_set_refusals_change_nothing(admin, assignment, fragment):
    before = admin.broker.config.default_queue_count
    line = failed(
        halfmoon(
            "cluster", "config", "set", "broker.default_queue_count=5", assignment, admin=admin
        )
    )
    assert fragment in line and line.endswith("(ILLEGAL_CONFIG)")
    assert admin.broker.config.default_queue_count == before


def test_config_usage_errors(admin):
    assert "bad assignment 'novalue'" in failed(
        halfmoon("cluster", "config", "set", "novalue", admin=admin), status=2
    )
    line = failed(halfmoon("cluster", "config", "get", "store.flush", admin=admin))
    assert "'store.flush' is not a runtime-changeable key" in line and line.endswith(
        "(ILLEGAL_CONFIG)"
    )
    assert "required: ACTION" in failed(halfmoon("cluster"), status=2)


def test_topic_status_and_route(admin):
    topic = unique("routed")
    admin.broker.create_topic(topic, queue_count=3)
    admin.broker.send([OutgoingMessage(topic=topic, body=b"x", queue_id=2) for _ in range(4)])

    out = ok(halfmoon("topic", "status", topic, admin=admin))
    rows = table(out)
    assert rows[0][:6] == ["QUEUE", "MIN", "OFFSET", "MAX", "OFFSET", "MESSAGES"]
    assert [r[:4] for r in rows[1:4]] == [
        ["0", "0", "0", "0"],
        ["1", "0", "0", "0"],
        ["2", "0", "4", "4"],
    ]
    assert out.rstrip().endswith("3 queues, 4 messages retained")
    data = json.loads(ok(halfmoon("topic", "status", topic, "--json", admin=admin)))
    assert [q["max_offset"] for q in data["queues"]] == [0, 0, 4]

    rows = table(ok(halfmoon("topic", "route", topic, admin=admin)))
    assert rows[0] == ["BROKER", "ADDRESS", "QUEUE", "PERM", "ACCEPTS"]
    assert rows[1] == ["halfmoon", admin.config.server.listen, "0", "rw", "normal"]
    data = json.loads(ok(halfmoon("topic", "route", topic, "--json", admin=admin)))
    assert [q["queue_id"] for q in data["queues"]] == [0, 1, 2]
    assert data["brokers"] == [{"broker": "halfmoon", "address": admin.config.server.listen}]

    admin.broker.update_topic(topic, perm="r")
    assert table(ok(halfmoon("topic", "route", topic, admin=admin)))[1][3] == "r"
    for action in ("status", "route"):
        assert failed(halfmoon("topic", action, "nope", admin=admin)).endswith("(TOPIC_NOT_FOUND)")
