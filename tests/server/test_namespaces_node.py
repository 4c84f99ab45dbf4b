"""Namespaces with the official Node.js client: tenants with the same names stay apart.

The Node.js client (1.0.8) puts its ``namespace`` option on the messages it
sends but not on its consumer requests' topic and group Resources; it sends
the namespace in the ``x-mq-namespace`` header on every call, which the
server falls back on. The scripts and fixtures are test_official_node_client's.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.server import test_official_node_client as node_client
from tests.server.test_official_node_client import _check_consumer, _check_sent, _fail

# That module's fixtures, used here under the same names.
node = node_client.node
scripts = node_client.scripts
shared_server = node_client.shared_server

pytestmark = pytest.mark.slow

TENANTS = ("node-ns-a", "node-ns-b")


def _admin(server: Any, method: str, path: str, body: dict[str, Any]) -> None:
    code, answer = server.admin_call(method, path, body)
    assert code in (200, 201), (path, code, answer)


def test_two_namespaces_with_the_same_names_do_not_see_each_others_messages(
    shared_server: Any, scripts: Any
) -> None:
    topic, group = "node-ns-orders", "node-ns-billing"
    for namespace in TENANTS:
        query = f"?namespace={namespace}"
        _admin(shared_server, "POST", "/v1/topics" + query, {"name": topic, "queue_count": 2})
        _admin(
            shared_server, "POST", "/v1/groups" + query, {"name": group, "consume_from": "earliest"}
        )
    base = {"endpoints": shared_server.grpc, "topic": topic}
    consumers = {
        namespace: scripts(
            "simple_consume.js",
            {
                **base,
                "namespace": namespace,
                "group": group,
                "expect": 5,
                "lingerMs": 1500,
                "deadlineMs": 20000,
                "awaitDurationMs": 1000,
            },
        )
        for namespace in TENANTS
    }
    sent: dict[str, dict[str, int]] = {}
    for namespace in TENANTS:
        messages = [{"body": f"{namespace}-{i}"} for i in range(5)]
        run = scripts("produce.js", {**base, "namespace": namespace, "messages": messages}).finish()
        sent[namespace] = _check_sent(run, 5, shared_server)
    for namespace, running in consumers.items():
        run = running.finish()
        received = _check_consumer(run, f"consumer in {namespace}", shared_server)
        ids = {r["messageId"] for r in received}
        assert ids == set(sent[namespace]), _fail(
            f"{namespace}: missing {set(sent[namespace]) - ids}, "
            f"extra {ids - set(sent[namespace])}",
            run,
        )
        assert len(received) == 5, _fail(f"{namespace}: delivered more than once", run)
        assert all(r["topic"] == topic and r["error"] is None for r in received), received
    # Stored per tenant; nothing under the bare name.
    assert shared_server.admin_call("GET", f"/v1/topics/{topic}")[0] == 404
    for namespace in TENANTS:
        code, status = shared_server.admin_call("GET", f"/v1/topics/{namespace}%25{topic}/status")
        assert code == 200 and sum(q["max_offset"] for q in status["queues"]) == 5, status
