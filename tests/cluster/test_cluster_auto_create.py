"""``broker.auto_create_topics`` in cluster mode: an unknown topic is created cluster-wide.

A route query (what every official client does before its first send) or a
send for an unknown topic places it over the brokers, once, even when both
proxies are asked at the same instant (etcd's compare-and-swap decides).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from halfmoon.cluster.coordination.etcd_json import range_prefix_sync
from halfmoon.cluster.coordination.etcd_tls import PLAIN
from halfmoon.cluster.coordination.keys import ClusterKeys
from tests.cluster.cluster_server import ClusterServer
from tests.cluster.test_cluster_routing import message, receive_bodies, unique

DEFAULT_QUEUES = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServer]:
    server = ClusterServer(
        tmp_path_factory.mktemp("auto-create"), settings=("broker.auto_create_topics=true",)
    ).start()
    try:
        yield server
    finally:
        if server.alive():
            server.stop()


def query_route(address: str, topic: str) -> svc.QueryRouteResponse:
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        request = svc.QueryRouteRequest(topic=pb.Resource(name=topic))
        return stub.QueryRoute(request, timeout=15)


def ask_both_at_once(cluster: ClusterServer, topic: str) -> dict[int, svc.QueryRouteResponse]:
    """Both proxies' QueryRoute for ``topic``, released together."""
    start = threading.Barrier(2)
    answers: dict[int, svc.QueryRouteResponse] = {}

    def ask(index: int) -> None:
        start.wait()
        answers[index] = query_route(cluster.proxies[index].address, topic)

    threads = [threading.Thread(target=ask, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


def test_route_queries_racing_on_both_proxies_create_the_topic_once(
    cluster: ClusterServer,
) -> None:
    for _ in range(3):
        topic = unique("raced")
        answers = ask_both_at_once(cluster, topic)
        assert set(answers) == {0, 1}
        for answer in answers.values():
            assert answer.status.code == pb.Code.OK, answer.status
            assert len(answer.message_queues) == DEFAULT_QUEUES
        # One record in etcd: both proxies route every queue to the same broker, spread.
        routes = [cluster.proxies[i].admin_call("GET", f"/v1/topics/{topic}/route") for i in (0, 1)]
        assert routes[0][0] == routes[1][0] == 200, routes
        owners = [[q["broker"] for q in body["queues"]] for _, body in routes]  # type: ignore[index]
        assert owners[0] == owners[1], owners
        assert set(owners[0]) == {"broker-a", "broker-b"}, owners
        kvs, _ = range_prefix_sync(
            [f"http://{cluster.etcd.address}"], ClusterKeys(cluster.cluster).topic(topic), tls=PLAIN
        )
        assert len(kvs) == 1 and kvs[0].json()["message_type"] == "mixed", kvs


def test_official_client_sends_to_an_unknown_topic_and_receives_from_both_brokers(
    cluster: ClusterServer,
) -> None:
    topic, group = unique("first-use"), unique("first-use-g")
    config = ClientConfiguration(cluster.grpc, Credentials(), request_timeout=10)
    producer = Producer(config, (topic,))
    producer.startup()
    cluster.create_group(group)
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    try:
        sent = {f"m{i}" for i in range(32)}
        for body in sorted(sent):
            producer.send(message(topic, body))
        assert set(receive_bodies(consumer, len(sent), 30)) == sent
    finally:
        producer.shutdown()
        consumer.shutdown()
    _, route = cluster.admin_call("GET", f"/v1/topics/{topic}/route")
    assert {q["broker"] for q in route["queues"]} == {"broker-a", "broker-b"}  # type: ignore[index]


def test_reserved_names_are_never_auto_created(cluster: ClusterServer) -> None:
    answer = query_route(cluster.proxies[1].address, f"%RETRY%{unique('g')}")
    assert answer.status.code != pb.Code.OK
