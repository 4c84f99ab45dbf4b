"""Priority and lite topics through the official Node.js client (1.0.8), against ``halfmoon serve``.

rocketmq-client-nodejs 1.0.8 has both: ``priority`` and ``liteTopic`` message
options, and ``LitePushConsumerBuilder`` (which handles NotifyUnsubscribeLiteCommand).
The scripts are in ``tests/node``; the fixtures come from the main Node.js module.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.server import test_official_node_client as nodes
from tests.server.test_official_node_client import _check_sent, _create_group, _create_topic, _fail

# The Node.js module's fixtures, shared (same server, same npm install).
node, scripts, shared_server = nodes.node, nodes.scripts, nodes.shared_server

pytestmark = pytest.mark.slow


def test_priority_backlog_is_consumed_highest_first(shared_server: Any, scripts: Any) -> None:
    topic, group = "node-priority", "node-priority-g"
    _create_topic(shared_server, topic, "priority", 4)
    _create_group(shared_server, group)
    # No priority 0: client 1.0.8 tests ``!this.priority`` and so sends priority 0 as a
    # NORMAL message, which it then refuses itself (a priority topic's route accepts
    # PRIORITY only, on RocketMQ as here).
    priorities = [1, 4, 2, 3, 1, 4, 7]
    messages = [{"body": f"{p}-{i}", "priority": p} for i, p in enumerate(priorities)]
    produced = scripts(
        "produce.js", {"endpoints": shared_server.grpc, "topic": topic, "messages": messages}
    ).finish()
    _check_sent(produced, len(messages), shared_server)
    run = scripts(
        "simple_consume.js",
        {
            "endpoints": shared_server.grpc,
            "topic": topic,
            "group": group,
            "expect": len(messages),
            "batchSize": 1,
            "deadlineMs": 20000,
            "awaitDurationMs": 1000,
        },
    ).finish()
    received = run.events("received")
    assert run.returncode == 0, _fail("priority consumer", run, server=shared_server)
    order = [base64.b64decode(r["bodyBase64"]).decode() for r in received]
    # 4 queues: priorities 3 and above share the last one, in send order.
    assert order == ["4-1", "3-3", "4-5", "7-6", "2-2", "1-0", "1-4"], order
    assert [r["priority"] for r in received] == [4, 3, 4, 7, 2, 1, 1]


def test_lite_push_consumer_gets_subscribed_lite_topics_and_unsubscribe_notices(
    shared_server: Any, scripts: Any
) -> None:
    topic, group = "node-lite", "node-lite-g"
    _create_topic(shared_server, topic, "lite", 1)
    _create_group(shared_server, group)
    consumer = scripts(
        "lite_push_consume.js",
        {
            "endpoints": shared_server.grpc,
            "group": group,
            "bindTopic": topic,
            "liteTopics": ["room-1", "room-2"],
            "expect": 4,
            "deadlineMs": 25000,
            "lingerMs": 3000,
        },
    )
    consumer.wait_for(
        lambda records: sum(r.get("event") == "subscribed" for r in records) == 2,
        20,
        "both lite subscriptions",
    )
    [started] = [r for r in consumer._records if r.get("event") == "started"]
    assert (started["quota"], started["maxLiteTopicSize"]) == (1000, 64)
    messages = [
        {"body": "r1-a", "liteTopic": "room-1"},
        {"body": "other", "liteTopic": "room-3"},
        {"body": "r2-a", "liteTopic": "room-2"},
        {"body": "r1-b", "liteTopic": "room-1"},
        {"body": "r2-b", "liteTopic": "room-2"},
    ]
    produced = scripts(
        "produce.js", {"endpoints": shared_server.grpc, "topic": topic, "messages": messages}
    ).finish()
    _check_sent(produced, len(messages), shared_server)
    consumer.wait_for(
        lambda records: sum(r.get("event") == "received" for r in records) >= 4,
        20,
        "four lite deliveries",
    )
    # Deleting a lite topic sends its subscribers NotifyUnsubscribeLiteCommand.
    code, answer = shared_server.admin_call("DELETE", f"/v1/topics/{topic}/lite-topics/room-2")
    assert code == 200 and answer["notified"] == 1, answer
    run = consumer.finish()
    assert run.returncode == 0, _fail("lite push consumer", run, server=shared_server)
    received = run.events("received")
    by_topic: dict[str, list[str]] = {}
    for r in received:
        assert r["topic"] == topic
        by_topic.setdefault(r["liteTopic"], []).append(r["body"])
    assert by_topic == {"room-1": ["r1-a", "r1-b"], "room-2": ["r2-a", "r2-b"]}, received
    # Client 1.0.8 has onNotifyUnsubscribeLiteCommand but its TelemetrySession does not
    # dispatch command case 9 to it: it logs the command as unrecognized and keeps the
    # lite topic (it would do the same against Apache RocketMQ). The log line is the
    # evidence that the command reached it.
    assert '"notifyUnsubscribeLiteCommand":{"liteTopic":"room-2"}' in run.stderr, run.stderr
    [lite_topics] = run.events("lite_topics")
    assert lite_topics["liteTopics"] == ["room-1", "room-2"]
