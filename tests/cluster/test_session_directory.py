"""Connected clients are listed through any proxy, whichever proxy they are connected to.

A real cluster (etcd, two brokers, two proxies); the official Python client
connects to the first proxy only, and the second proxy's admin API is asked.
"""

from __future__ import annotations

from typing import Any

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

from tests.cluster.cluster_server import ClusterProxy, ClusterServer
from tests.server.conftest import unique, wait_until


def _first_proxy_only(cluster: ClusterServer) -> ClientConfiguration:
    return ClientConfiguration(cluster.proxies[0].address, Credentials(), request_timeout=5)


def _listed(proxy: ClusterProxy, path: str) -> list[dict[str, Any]]:
    code, body = proxy.admin_call("GET", path)
    assert code == 200 and isinstance(body, dict), body
    assert body["registry"] is True
    return list(body["clients"])


def test_a_consumer_and_a_producer_on_one_proxy_are_listed_by_the_other(
    cluster: ClusterServer,
) -> None:
    topic, group = unique("listed"), unique("listed-group")
    cluster.create_topic(topic, "normal", queues=4)
    other = cluster.proxies[1]
    producer = Producer(_first_proxy_only(cluster), (topic,))
    producer.startup()
    consumer = SimpleConsumer(
        _first_proxy_only(cluster), group, {topic: FilterExpression("TagA")}, await_duration=2
    )
    consumer.startup()
    try:
        message = Message()
        message.topic, message.body = topic, b"hello"
        producer.send(message)  # a producer is listed for the topics it sent to
        consumers: Any = wait_until(
            lambda: _listed(other, f"/v1/groups/{group}/clients"),
            15,
            "the consumer listed by the proxy it is not connected to",
        )
        (listed,) = consumers
        assert listed["worker"].startswith(f"proxy-{cluster.proxies[0].grpc_port}/")
        assert listed["subscriptions"] == [{"topic": topic, "filter_type": "tag", "filter": "TagA"}]
        assert "is_consumer" not in listed and "publishes" not in listed  # for choosing only
        producers: Any = wait_until(
            lambda: _listed(other, f"/v1/topics/{topic}/producers"),
            15,
            "the producer listed by the proxy it is not connected to",
        )
        assert [p["worker"] for p in producers] == [listed["worker"]]
        # Both proxies answer the same listing (the first from its own registry).
        assert [c["client_id"] for c in _listed(cluster, f"/v1/groups/{group}/clients")] == [
            listed["client_id"]
        ]
        code, status = other.admin_call("GET", "/v1/broker/status")
        assert code == 200 and isinstance(status, dict), status
        assert status["clients"] >= 2 and status["producers"] >= 1, status
    finally:
        consumer.shutdown()
        producer.shutdown()
    # A client that leaves is gone from every proxy's listing once its worker republishes.
    wait_until(
        lambda: _listed(other, f"/v1/groups/{group}/clients") == [],
        15,
        "the consumer that shut down to leave the other proxy's listing",
    )
