"""Transactional messages through the official Node.js client (``rocketmq-client-nodejs``).

``tests/node/transaction_produce.js`` runs RocketMQ's TransactionProducer
example: half messages committed, rolled back or left open, a checker that
answers the server's checks from a status per message. ``simple_consume.js``
then shows what consumers see. Node.js plumbing (npm install, script runs) is
shared with ``test_official_node_client.py``.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import pytest

from tests.server.conftest import ServerProcess, unique, wait_until
from tests.server.test_official_node_client import (  # noqa: F401 - fixtures
    OneProxyCluster,
    _fail,
    _server_errors,
    node,
    scripts,
)

pytestmark = pytest.mark.slow

CHECK_MAX = 3
SETTINGS = (
    "transaction.timeout_ms=400ms",
    "transaction.check_interval_ms=250ms",
    f"transaction.check_max={CHECK_MAX}",
)


@pytest.fixture(scope="module", params=["local", "cluster"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """``halfmoon serve``, or a cluster (etcd, two brokers, two proxies; the Node.js client
    given one of them): the same scenario through both."""
    kind = {"local": ServerProcess, "cluster": OneProxyCluster}[request.param]
    proc = kind(
        tmp_path_factory.mktemp(f"halfmoon-txn-node-{request.param}"), settings=SETTINGS
    ).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


def transactions(server: ServerProcess, path: str) -> list[dict[str, Any]]:
    code, body = server.admin_call("GET", path)
    assert code == 200, body
    return body["transactions"]  # type: ignore[index]


def test_node_producer_with_checker_delivers_exactly_the_committed_messages(
    node: str,  # noqa: F811 - fixture
    scripts: Any,  # noqa: F811 - fixture
    server: ServerProcess,
) -> None:
    topic, group = unique("txn-node"), unique("g")
    server.create_topic(topic, "transaction", queues=4)
    server.create_group(group)
    first_line = len(server.lines)
    plan = [
        {"body": "m0", "end": "commit"},
        {"body": "m1", "end": "rollback"},
        {"body": "m2", "end": "none", "check": "commit"},
        {"body": "m3", "end": "none", "check": "rollback"},
        {"body": "m4", "end": "commit", "keys": ["k4"]},
        {"body": "m5", "end": "none", "check": "commit"},
        {"body": "m6", "end": "none", "check": "unknown"},  # parked after the check limit
    ]
    producer = scripts(
        "transaction_produce.js",
        {"endpoints": server.grpc, "topic": topic, "messages": plan, "deadlineMs": 40000},
    )
    producer.wait_for(
        lambda records: any(r.get("event") == "waiting" for r in records),
        30,
        "every half message sent",
    )
    run = producer._snapshot()
    assert not run.events("send_error"), _fail("a transactional send failed", run, server=server)
    ids = {r["index"]: r["messageId"] for r in run.events("sent")}
    assert len(ids) == len(plan) and all(r["transactionId"] for r in run.events("sent"))

    # The checks decide m2, m3, m5; m6 ends parked after CHECK_MAX unanswered checks.
    def settled() -> bool:
        left = transactions(server, f"/v1/transactions?topic={topic}")
        return [(t["message_id"], t["state"]) for t in left] == [(ids[6], "parked")]

    wait_until(settled, 30, "checks to decide every transaction but the unknown one, which parks")
    (parked,) = [t for t in transactions(server, "/v1/transactions/parked") if t["topic"] == topic]
    assert parked["checks_sent"] == CHECK_MAX
    producer.kill()

    checked = collections.Counter(r["body"] for r in producer._snapshot().events("checked"))
    # Decided transactions are never checked; the unknown one exactly check_max times.
    assert set(checked) <= {"m2", "m3", "m5", "m6"} and {"m2", "m3", "m5", "m6"} <= set(checked), (
        checked
    )
    assert checked["m6"] == CHECK_MAX and all(checked[b] == 1 for b in ("m2", "m3", "m5")), checked

    expected = {ids[i]: plan[i]["body"] for i in (0, 2, 4, 5)}
    consumer = scripts("simple_consume.js", {
        "endpoints": server.grpc, "group": group, "topic": topic,
        "expect": len(expected), "deadlineMs": 20000, "lingerMs": 1500, "awaitDurationMs": 1000,
    })  # fmt: skip
    done = consumer.finish()
    assert done.returncode == 0 and not done.events("receive_error"), _fail(
        "consumer failed", done, server=server
    )
    got = collections.Counter(r["messageId"] for r in done.events("received"))
    assert set(got) == set(expected) and all(n == 1 for n in got.values()), _fail(
        f"deliveries {got}", done
    )
    keys = {r["messageId"]: r.get("keys") for r in done.events("received")}
    assert keys[ids[4]] == ["k4"]
    errors = _server_errors(server.lines[first_line:])
    assert not errors, "the server logged errors:\n" + server.log_tail(60)
