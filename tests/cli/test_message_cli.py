"""``halfmoon message ...`` end to end: a subprocess against a real admin API and Broker."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator

import pytest

from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.server.admin import admin_request_limit
from tests.cli.admin_harness import AdminServer
from tests.cli.test_cli import failed, failed_json, halfmoon, ok, table, unique


@pytest.fixture(scope="module")
def admin(tmp_path_factory) -> Iterator[AdminServer]:
    with AdminServer(tmp_path_factory.mktemp("metadata")) as server:
        yield server


def topic_with(admin: AdminServer, queues: int = 2) -> str:
    name = unique("msgs")
    admin.broker.create_topic(name, queue_count=queues)
    return name


def test_send_with_the_shipped_topic_flag_still_sends_and_warns_once(admin):
    topic = topic_with(admin)
    result = halfmoon("message", "send", "--topic", topic, "--body", "old", "--json", admin=admin)
    assert result.returncode == 0, result.stderr
    assert result.stderr == (
        "halfmoon: warning: 'halfmoon message send --topic TOPIC' is deprecated;"
        " write 'halfmoon message send TOPIC'\n"
    )
    sent = json.loads(result.stdout)
    stored = json.loads(ok(halfmoon("message", "get", sent["message_id"], "--json", admin=admin)))
    assert [m["topic"] for m in stored["messages"]] == [topic]


def test_send_then_get_by_id_with_and_without_topic(admin):
    topic = topic_with(admin)
    out = ok(
        halfmoon(
            "message",
            "send",
            topic,
            "--body",
            "hello",
            "--key",
            "order-1",
            "--key",
            "k2",
            "--tag",
            "created",
            "--queue",
            "1",
            "--property",
            "region=eu",
            admin=admin,
        )
    )
    assert out.startswith("sent message ") and f"to '{topic}' queue 1 offset 0" in out
    message_id = out.split()[2]

    shown = ok(halfmoon("message", "get", message_id, admin=admin))
    assert "message id:" in shown and message_id in shown
    assert "tag:" in shown and "created" in shown
    assert shown.rstrip().endswith("body:\nhello")

    data = json.loads(
        ok(halfmoon("message", "get", message_id, "--topic", topic, "--json", admin=admin))
    )
    assert len(data["messages"]) == 1
    got = data["messages"][0]
    assert (got["topic"], got["queue_id"], got["queue_offset"]) == (topic, 1, 0)
    assert (got["body"], got["body_encoding"], got["keys"], got["properties"]) == (
        "hello",
        "utf-8",
        ["order-1", "k2"],
        {"region": "eu"},
    )


def test_send_json_and_a_binary_body_from_a_file(admin, tmp_path):
    topic = topic_with(admin, queues=1)
    payload = bytes(range(256))
    path = tmp_path / "body.bin"
    path.write_bytes(payload)
    result = json.loads(
        ok(halfmoon("message", "send", topic, "--body-file", str(path), "--json", admin=admin))
    )
    assert (result["topic"], result["queue_id"], result["queue_offset"]) == (topic, 0, 0)
    got = json.loads(
        ok(
            halfmoon(
                "message",
                "read",
                topic,
                "--queue",
                "0",
                "--offset",
                "0",
                "--json",
                admin=admin,
            )
        )
    )
    assert got["body_encoding"] == "base64"
    assert base64.b64decode(got["body"]) == payload
    assert got["message_id"] == result["message_id"]


def test_send_a_priority_and_a_lite_message(admin):
    jobs, chat = unique("jobs"), unique("chat")
    admin.broker.create_topic(jobs, MessageType.PRIORITY, queue_count=8)
    admin.broker.create_topic(chat, MessageType.LITE)
    sent = halfmoon(
        "message", "send", jobs, "--body", "urgent", "--priority", "7", "--json", admin=admin
    )
    urgent = json.loads(ok(sent))
    read = ["message", "read", jobs, "--queue", str(urgent["queue_id"]), "--offset", "0"]
    assert json.loads(ok(halfmoon(*read, "--json", admin=admin)))["priority"] == 7
    ok(halfmoon("message", "send", chat, "--body", "hi", "--lite-topic", "session-42", admin=admin))
    listed = json.loads(ok(halfmoon("topic", "lite-list", chat, "--json", admin=admin)))
    assert [t["lite_topic"] for t in listed["lite_topics"]] == ["session-42"]


def test_get_errors(admin):
    topic = topic_with(admin)
    line = failed(halfmoon("message", "get", "01DEADBEEF", admin=admin))
    assert "no message with id '01DEADBEEF' in any topic" in line and line.endswith(
        "(MESSAGE_NOT_FOUND)"
    )
    error = failed_json(halfmoon("message", "get", "x", "--topic", topic, "--json", admin=admin))
    assert error["code"] == "MESSAGE_NOT_FOUND" and "no message with id 'x'" in error["message"]
    assert failed(halfmoon("message", "get", "x", "--topic", "nope", admin=admin)).endswith(
        "(TOPIC_NOT_FOUND)"
    )
    assert failed(halfmoon("message", "send", "nope", "--body", "x", admin=admin)).endswith(
        "(TOPIC_NOT_FOUND)"
    )
    assert "one of the arguments --body --body-file is required" in failed(
        halfmoon("message", "send", topic, admin=admin), status=2
    )
    assert "bad --property 'novalue'" in failed(
        halfmoon("message", "send", topic, "--body", "x", "--property", "novalue", admin=admin),
        status=2,
    )


def test_query_by_key_within_a_time_range(admin):
    topic = topic_with(admin)
    admin.broker.send(
        [
            OutgoingMessage(topic=topic, body=b"a", keys=["order-7"], tag="t1"),
            OutgoingMessage(topic=topic, body=b"b", keys=["order-7", "x"]),
            OutgoingMessage(topic=topic, body=b"c", keys=["order-8"]),
        ]
    )
    rows = table(
        ok(
            halfmoon(
                "message",
                "query",
                topic,
                "--key",
                "order-7",
                "--begin",
                "1h",
                admin=admin,
            )
        )
    )
    assert rows[0][:4] == ["MESSAGE", "ID", "QUEUE", "OFFSET"]
    assert len(rows) == 3

    data = json.loads(
        ok(halfmoon("message", "query", topic, "--key", "order-7", "--json", admin=admin))
    )
    assert sorted(m["body"] for m in data["messages"]) == ["a", "b"]

    past = str(int(time.time() * 1000) - 3_600_000)
    out = ok(halfmoon("message", "query", topic, "--key", "order-7", "--end", past, admin=admin))
    assert out == f"no message with key 'order-7' in '{topic}' in that time range\n"
    assert "--end" in failed(
        halfmoon(
            "message",
            "query",
            topic,
            "--key",
            "k",
            "--begin",
            "now",
            "--end",
            "1h",
            admin=admin,
        ),
        status=2,
    )
    assert "bad time 'yesterday'" in failed(
        halfmoon("message", "query", topic, "--key", "k", "--begin", "yesterday", admin=admin),
        status=2,
    )


def test_read_at_queue_offset_and_its_errors(admin):
    topic = topic_with(admin)
    admin.broker.send(
        [OutgoingMessage(topic=topic, body=f"m{i}".encode(), queue_id=1) for i in range(3)]
    )
    out = ok(halfmoon("message", "read", topic, "--queue", "1", "--offset", "2", admin=admin))
    assert "queue offset:" in out and out.rstrip().endswith("body:\nm2")

    line = failed(halfmoon("message", "read", topic, "--queue", "1", "--offset", "3", admin=admin))
    assert (
        "no message at offset 3" in line
        and "offsets 0 to 2" in line
        and line.endswith("(MESSAGE_NOT_FOUND)")
    )
    line = failed(halfmoon("message", "read", topic, "--queue", "9", "--offset", "0", admin=admin))
    assert "has no queue 9" in line and line.endswith("(BAD_REQUEST)")


def test_consume_from_an_offset_or_a_time_with_a_count(admin):
    topic = topic_with(admin)
    admin.broker.send(
        [OutgoingMessage(topic=topic, body=f"q0-{i}".encode(), queue_id=0) for i in range(5)]
    )
    admin.broker.send(
        [OutgoingMessage(topic=topic, body=f"q1-{i}".encode(), queue_id=1) for i in range(5)]
    )

    out = ok(halfmoon("message", "consume", topic, "--queue", "1", "--offset", "3", admin=admin))
    lines = out.strip().splitlines()
    assert [line.rsplit("| ", 1)[1] for line in lines] == ["q1-3", "q1-4"]
    assert lines[0].startswith("queue 1 offset 3")

    data = json.loads(
        ok(
            halfmoon(
                "message",
                "consume",
                topic,
                "--begin",
                "1h",
                "--count",
                "7",
                "--json",
                admin=admin,
            )
        )
    )
    assert [m["body"] for m in data["messages"]] == [f"q0-{i}" for i in range(5)] + ["q1-0", "q1-1"]

    # Reading moves no group: one that acknowledged two messages still has lag 8.
    group = unique("reader")
    admin.broker.create_group(group, consume_from="earliest")
    for view in admin.broker.receive(group, topic, FilterSpec(), 2, 60_000):
        admin.broker.ack(group, topic, view.receipt_handle)
    lag = sum(q.lag for q in admin.broker.group_progress(group, topic))
    ok(halfmoon("message", "consume", topic, "--count", "10", admin=admin))
    assert sum(q.lag for q in admin.broker.group_progress(group, topic)) == lag == 8
    later = str(int(time.time() * 1000) + 60_000)
    assert (
        ok(halfmoon("message", "consume", topic, "--begin", later, admin=admin))
        == "no messages in that range\n"
    )
    assert "--offset needs --queue" in failed(
        halfmoon("message", "consume", topic, "--offset", "1", admin=admin), status=2
    )


def test_print_with_filters_bodies_and_tag_counts(admin):
    topic = topic_with(admin)
    tags = ["created", "paid", "created", None, "created", "shipped"]
    admin.broker.send(
        [
            OutgoingMessage(
                topic=topic,
                body=f"b{i}".encode(),
                tag=tag,
                properties={"n": str(i)},
                queue_id=i % 2,
            )
            for i, tag in enumerate(tags)
        ]
    )
    out = ok(halfmoon("message", "print", topic, admin=admin))
    assert out.rstrip().endswith("total: 6")
    assert sum(1 for line in out.splitlines() if line.startswith("queue ")) == 6

    out = ok(
        halfmoon(
            "message",
            "print",
            topic,
            "--filter",
            "paid || shipped",
            "--no-bodies",
            admin=admin,
        )
    )
    printed = [line for line in out.splitlines() if line.startswith("queue ")]
    assert len(printed) == 2 and all("| " not in line for line in printed)

    rows = table(ok(halfmoon("message", "print", topic, "--tag-counts", admin=admin)))
    assert rows[:5] == [
        ["TAG", "COUNT"],
        ["created", "3"],
        ["(none)", "1"],
        ["paid", "1"],
        ["shipped", "1"],
    ]

    data = json.loads(
        ok(
            halfmoon(
                "message",
                "print",
                topic,
                "--sql",
                "n > 3",
                "--tag-counts",
                "--json",
                admin=admin,
            )
        )
    )
    assert data["matched"] == 2
    assert {t["tag"]: t["count"] for t in data["tags"]} == {"created": 1, "shipped": 1}

    printed = json.loads(
        ok(halfmoon("message", "print", topic, "--queue", "1", "--json", admin=admin))
    )
    assert [m["body"] for m in printed["messages"]] == ["b1", "b3", "b5"]
    assert printed["matched"] == 3


def test_print_errors(admin):
    topic = topic_with(admin)
    line = failed(halfmoon("message", "print", topic, "--sql", "n >", admin=admin))
    assert "(" in line  # the filter's own code, on one line
    assert failed(halfmoon("message", "print", "nope", admin=admin)).endswith("(TOPIC_NOT_FOUND)")
    assert failed(halfmoon("message", "print", topic, "--queue", "5", admin=admin)).endswith(
        "(BAD_REQUEST)"
    )
    assert "not allowed with argument" in failed(
        halfmoon("message", "print", topic, "--filter", "a", "--sql", "x = 1", admin=admin),
        status=2,
    )


def test_paging_reads_past_one_page(admin):
    topic = topic_with(admin, queues=1)
    admin.broker.send([OutgoingMessage(topic=topic, body=b"x", tag="t") for _ in range(1200)])
    data = json.loads(
        ok(halfmoon("message", "consume", topic, "--count", "1100", "--json", admin=admin))
    )
    assert [m["queue_offset"] for m in data["messages"]] == list(range(1100))
    counted = json.loads(
        ok(halfmoon("message", "print", topic, "--tag-counts", "--json", admin=admin))
    )
    assert counted["matched"] == 1200


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("/scan?offset=3", "'offset' needs 'queue'"),
        ("/scan?limit=10001", "'limit' is at most 10000"),
        ("/scan?limit=zero", "'limit' must be an integer"),
        ("/scan?filter_type=regex", "'filter_type' must be tag or sql92"),
        ("/scan?bodies=maybe", "'bodies' must be true or false"),
        ("/scan?begin_ms=10&end_ms=5", "end_ms (5) is before begin_ms (10)"),
        ("/messages", "'key' is required"),
        ("/queues/x/offsets/0", "queue id must be a non-negative integer"),
    ],
)
def test_read_endpoints_refuse_bad_parameters(admin, path, fragment):
    topic = topic_with(admin, queues=1)
    status, answer = admin.call("GET", f"/v1/topics/{topic}{path}")
    assert status == 400, answer
    assert answer["error"]["code"] == "BAD_REQUEST" and fragment in answer["error"]["message"]


def test_send_endpoint_refuses_bad_bodies(admin):
    topic = topic_with(admin, queues=1)
    for body, fragment in [
        ({"body": "!!", "body_encoding": "base64"}, "not valid base64"),
        ({"body": "x", "keys": [1]}, "array of strings"),
        ({"body": "x", "colour": "red"}, "unknown field(s) 'colour'"),
        ({}, "field 'body' is required"),
    ]:
        status, answer = admin.call("POST", f"/v1/topics/{topic}/messages", body)
        assert status == 400 and fragment in answer["error"]["message"], answer
    assert admin.broker.store.max_offset(topic, 0) == 0


def test_trace_shows_what_the_broker_did(admin):
    topic = topic_with(admin, queues=1)
    (sent,) = admin.broker.send([OutgoingMessage(topic, b"traced")])
    (view,) = admin.broker.receive("tracers", topic, FilterSpec(), 1, 10_000, client_id="c-7")
    admin.broker.ack("tracers", topic, view.receipt_handle)
    out = ok(halfmoon("message", "trace", sent.message_id, admin=admin))
    lines = out.strip().splitlines()
    assert [line.split()[2] for line in lines] == ["stored", "delivered", "acked"], out
    assert f"topic={topic} queue_id=0 queue_offset=0" in lines[0]
    assert "group=tracers attempt=1 mode=pop client=c-7" in lines[1]
    answer = json.loads(ok(halfmoon("message", "trace", sent.message_id, "--json", admin=admin)))
    assert [e["event"] for e in answer["events"]] == ["stored", "delivered", "acked"]
    result = halfmoon("message", "trace", "no-such-id", admin=admin)
    assert result.returncode != 0 and "MESSAGE_NOT_FOUND" in result.stderr


def test_a_body_as_large_as_the_broker_takes_goes_through_the_admin_api(admin, tmp_path):
    # Binary, so the API carries it base64-encoded: a third larger on the wire.
    limit = admin.config.broker.max_body_size
    body = tmp_path / "largest.bin"
    body.write_bytes(bytes(range(256)) * (limit // 256))
    assert body.stat().st_size == limit
    topic = topic_with(admin)
    sent = json.loads(
        ok(halfmoon("message", "send", topic, "--body-file", str(body), "--json", admin=admin))
    )
    assert sent["message_id"]


def test_a_request_over_the_limit_names_the_limit_and_the_setting(admin):
    status, answer = admin.call(
        "POST", "/v1/topics/x/messages", raw=b"x" * (admin_request_limit(admin.config) + 1)
    )
    assert status == 413
    assert answer["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert "broker.max_body_size" in answer["error"]["message"]
    assert str(admin.config.broker.max_body_size) in answer["error"]["message"]
