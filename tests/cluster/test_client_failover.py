"""halfmoon's own client and the Spark connector's wire given both proxies (``a;b``).

SIGKILL the proxy the client is connected to: it carries on through the
other, losing nothing it was told was sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from halfmoon.client import Message, MessageSelector, SyncProducer, SyncSimpleConsumer
from halfmoon.client.endpoints import channel_target, endpoints_pb, endpoints_text
from halfmoon.outbox.targets import HalfmoonTarget, InvalidTarget
from halfmoon.spark.options import endpoint_of
from halfmoon.spark.wire import Wire
from tests.cluster.cluster_server import ClusterServer
from tests.cluster.test_cluster_routing import unique


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[ClusterServer]:
    server = ClusterServer(tmp_path / "cluster").start()
    try:
        yield server
    finally:
        server.kill()


def test_an_endpoint_list_is_one_channel_over_every_address() -> None:
    assert channel_target("127.0.0.1:1;127.0.0.1:2") == ("ipv4:127.0.0.1:1,127.0.0.1:2", [])
    assert channel_target("10.0.0.1:8081") == ("10.0.0.1:8081", [])
    target, options = channel_target("localhost:7;127.0.0.1:8")
    assert target.startswith(("ipv4:127.0.0.1:7", "ipv6:[::1]:7")), target
    assert options == [("grpc.default_authority", "localhost:7")]
    assert endpoints_text(endpoints_pb("127.0.0.1:1;127.0.0.1:2")) == "127.0.0.1:1;127.0.0.1:2"
    with pytest.raises(ValueError, match="host:port"):
        endpoints_pb("127.0.0.1:1;nohost")
    # The outbox relay's target and the Spark option take the same lists.
    assert (
        HalfmoonTarget("halfmoon://127.0.0.1:1;127.0.0.1:2").endpoint == "127.0.0.1:1;127.0.0.1:2"
    )
    assert endpoint_of({"endpoint": "127.0.0.1:1; 127.0.0.1:2"}) == "127.0.0.1:1;127.0.0.1:2"
    with pytest.raises(InvalidTarget):
        HalfmoonTarget("halfmoon://127.0.0.1:1;nohost")


def receive(consumer: SyncSimpleConsumer, count: int) -> list[str]:
    got: list[str] = []
    for _ in range(60):
        if len(got) >= count:
            break
        for view in consumer.receive(32, 15, wait=1):
            got.append(view.body.decode())
            consumer.ack(view)
    return got


def test_halfmoon_client_carries_on_through_the_other_proxy(own_cluster: ClusterServer) -> None:
    topic, group = unique("hm-failover"), unique("hm-failover-g")
    own_cluster.create_topic(topic, "normal", queues=4)
    own_cluster.create_group(group)
    endpoints = own_cluster.grpc  # "first;second"
    assert endpoints.count(";") == 1, endpoints
    with (
        SyncProducer(endpoints, request_timeout=5) as producer,
        SyncSimpleConsumer(
            endpoints, group, {topic: MessageSelector.all()}, request_timeout=5
        ) as consumer,
    ):
        for i in range(10):
            producer.send(Message(topic, f"before-{i}".encode()))
        first = receive(consumer, 10)
        own_cluster.kill_proxy(0)  # SIGKILL the proxy both are connected to
        for i in range(10):
            producer.send(Message(topic, f"after-{i}".encode()))
        second = receive(consumer, 10)
    assert sorted(first) == sorted(f"before-{i}" for i in range(10))
    assert sorted(second) == sorted(f"after-{i}" for i in range(10))


def test_spark_wire_reads_through_the_other_proxy(own_cluster: ClusterServer) -> None:
    topic = unique("spark-failover")
    own_cluster.create_topic(topic, "normal", queues=4)
    with SyncProducer(own_cluster.grpc, request_timeout=5) as producer:
        for i in range(8):
            producer.send(Message(topic, f"m{i}".encode()))
    wire = Wire(own_cluster.grpc, timeout=5)
    assert len(wire.queues(topic)) == 4
    own_cluster.kill_proxy(0)
    queues = wire.queues(topic)
    assert len(queues) == 4
    total = sum(wire.query_offset(q, "latest") for q in queues)
    assert total == 8
