"""Lite topics (RIP-83) in cluster mode, through the official Python client (5.1.2).

The local scenarios run unchanged against a cluster (imported, not copied),
and a lite parent topic spread over both brokers keeps each lite topic on one
broker: its messages in send order, its subscription and quotas there.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from rocketmq import Message, Producer
from rocketmq.v5.consumer import LiteSimpleConsumer

from tests.cluster.cluster_server import ClusterServer
from tests.server.conftest import wait_until
from tests.server.test_lite_priority_python import (
    lite_message,
    manager_of,
    subscribe,
    test_lite_push_consumer_receives_subscribed_lite_topics,  # noqa: F401 - run here too
    test_lite_simple_consumer_gets_its_lite_topics_only,  # noqa: F401 - run here too
)
from tests.server.test_official_python_client import config, unique

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServer]:
    proc = ClusterServer(tmp_path_factory.mktemp("lite-cluster")).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


@pytest.fixture(scope="module")
def producer(server: ClusterServer) -> Iterator[Producer]:
    p = Producer(config(server))
    p.startup()
    yield p
    p.shutdown()


def test_each_lite_topic_of_a_spread_parent_keeps_its_order_on_one_broker(
    server: ClusterServer, producer: Producer
) -> None:
    topic, group = unique("spread-lite"), unique("gspread-lite")
    server.create_topic(topic, "lite", queues=4)
    code, route = server.admin_call("GET", f"/v1/topics/{topic}/route")
    assert {q["broker"] for q in route["queues"]} == {"broker-a", "broker-b"}  # type: ignore[index]
    server.create_group(group)
    sessions = [f"s{i}" for i in range(5)]  # odd: round-robin would move each between brokers
    consumer = LiteSimpleConsumer(topic, config(server), group, await_duration=2)
    consumer.startup()
    try:
        manager = manager_of(consumer)
        wait_until(lambda: manager.lite_subscription_quota == 1000, 10, "lite settings")  # type: ignore[attr-defined]
        for session in sessions:
            subscribe(consumer, session)
        for i in range(4):
            for session in sessions:
                producer.send(lite_message(topic, session, f"{session}-{i}"))
        got: list[Message] = []
        deadline = time.monotonic() + 30
        while len(got) < 4 * len(sessions) and time.monotonic() < deadline:
            for msg in consumer.receive(32, 15):
                got.append(msg)
                consumer.ack(msg)
    finally:
        consumer.shutdown()
    for session in sessions:
        bodies = [m.body.decode() for m in got if m.lite_topic == session]
        assert bodies == [f"{session}-{i}" for i in range(4)], (session, bodies)
    # Each lite topic lives on one broker (listed once, not once per broker).
    code, listed = server.admin_call("GET", f"/v1/topics/{topic}/lite-topics")
    assert code == 200, listed
    rows = listed["lite_topics"]  # type: ignore[index]
    names = [row["lite_topic"] for row in rows]
    assert sorted(names) == sorted(sessions), rows
