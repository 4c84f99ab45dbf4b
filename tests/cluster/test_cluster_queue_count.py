"""Changing a cluster topic's queue count through any proxy, with the official client sending.

Growing places new queues over the brokers; shrinking leaves the removed
queues readable (read-only) until drained. Every proxy routes the change
within a second, and nothing acknowledged is lost across either change.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer

from tests.cluster.cluster_server import ClusterServer, wait_until
from tests.cluster.test_cluster_routing import message, receive_bodies, unique
from tests.server.conftest import ROOT


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServer]:
    server = ClusterServer(tmp_path_factory.mktemp("queue-count")).start()
    try:
        yield server
    finally:
        if server.alive():
            server.stop()


def route(cluster: ClusterServer, proxy: int, topic: str) -> list[dict]:
    code, body = cluster.proxies[proxy].admin_call("GET", f"/v1/topics/{topic}/route")
    assert code == 200, body
    return body["queues"]  # type: ignore[index,no-any-return]


def writable(queues: list[dict]) -> list[int]:
    return [q["queue_id"] for q in queues if "w" in q["perm"]]


def update_queues(cluster: ClusterServer, proxy: int, topic: str, count: int) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "halfmoon", "topic", "update", topic, "--queues", str(count),
         "--admin", cluster.proxies[proxy].admin],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def routed_within_a_second(cluster: ClusterServer, proxy: int, topic: str, want: object) -> None:
    changed = time.monotonic()
    wait_until(lambda: shape(route(cluster, proxy, topic)) == want, 1.0, f"route {want}")
    assert time.monotonic() - changed < 1.0


def queue_status(cluster: ClusterServer, topic: str) -> list[dict]:
    code, body = cluster.admin_call("GET", f"/v1/topics/{topic}/status")
    assert code == 200, body
    return body["queues"]  # type: ignore[index,no-any-return]


def shape(queues: list[dict]) -> tuple[int, list[int]]:
    return len(queues), writable(queues)


class Sender(threading.Thread):
    """Sends numbered messages until stopped; remembers the ones acknowledged."""

    def __init__(self, producer: Producer, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer, self.topic = producer, topic
        self.acknowledged: list[str] = []
        self.failures: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            body = f"m{n}"
            n += 1
            try:
                self.producer.send(message(self.topic, body))
                self.acknowledged.append(body)
            except Exception as error:  # noqa: BLE001 - counted, the test decides
                self.failures.append(repr(error))

    def wait_for_more(self, count: int) -> None:
        target = len(self.acknowledged) + count
        wait_until(lambda: len(self.acknowledged) >= target, 30, f"{count} more sends")


def test_growing_then_shrinking_under_sends_loses_nothing(cluster: ClusterServer) -> None:
    topic, group = unique("resized"), unique("resized-g")
    cluster.create_topic(topic, "normal", queues=4)
    cluster.create_group(group)
    config = ClientConfiguration(cluster.grpc, Credentials(), request_timeout=10)
    producer = Producer(config, (topic,))
    producer.startup()
    sender = Sender(producer, topic)
    sender.start()
    try:
        sender.wait_for_more(20)
        update_queues(cluster, 1, topic, 8)  # through the second proxy
        routed_within_a_second(cluster, 0, topic, (8, list(range(8))))
        queues = route(cluster, 0, topic)
        assert {q["broker"] for q in queues[4:]} == {"broker-a", "broker-b"}, queues
        sender.wait_for_more(40)

        update_queues(cluster, 0, topic, 2)
        routed_within_a_second(cluster, 1, topic, (8, [0, 1]))
        sender.wait_for_more(40)
        status = queue_status(cluster, topic)
        removed_before = {r["queue_id"]: r["max_offset"] for r in status if r["queue_id"] >= 2}
        assert all(r["perm"] == "r" for r in status if r["queue_id"] >= 2), status
        sender.wait_for_more(40)
    finally:
        sender.stop.set()
        sender.join(30)
        producer.shutdown()
    # The removed queues took no sends once the change was routed (stale routes steered).
    status = queue_status(cluster, topic)
    removed_after = {r["queue_id"]: r["max_offset"] for r in status if r["queue_id"] >= 2}
    assert removed_after == removed_before
    assert any(offset > 0 for offset in removed_after.values())  # they hold messages to drain
    assert not sender.failures, sender.failures[:3]
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=2)
    consumer.startup()
    try:
        got = receive_bodies(consumer, len(sender.acknowledged), 60)
    finally:
        consumer.shutdown()
    # Every acknowledged message, those on the read-only queues included, once.
    assert sorted(got) == sorted(sender.acknowledged)


def test_a_shrunk_topic_grows_back_onto_its_own_queues(cluster: ClusterServer) -> None:
    topic = unique("regrow")
    cluster.create_topic(topic, "normal", queues=4)
    before = route(cluster, 0, topic)
    update_queues(cluster, 0, topic, 2)
    update_queues(cluster, 1, topic, 6)
    routed_within_a_second(cluster, 0, topic, (6, list(range(6))))
    after = route(cluster, 0, topic)
    assert [q["broker"] for q in after[:4]] == [q["broker"] for q in before]
