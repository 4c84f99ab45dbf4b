"""Sends without a message group spread round-robin over a topic's queues, hence over its
brokers, through a real cluster (etcd, two broker processes, a proxy process): with halfmoon's
client, the official Python client, and the members of transaction groups.

docs/cluster.md promises round-robin for such messages. Each send draws once from the
proxy's per-topic rotation, and the proxy knows every broker's writability before a send
needs it, so its sends are planned on the event loop (``send_plan.py``).
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections import Counter

import pytest
from rocketmq import ClientConfiguration, Credentials, Producer

from halfmoon.client import Message, SyncProducer, SyncTransactionProducer
from halfmoon.cluster.proxy.broker_pool import WRITABLE_TTL_S
from tests.cluster.cluster_server import ClusterServer
from tests.cluster.test_cluster_routing import message
from tests.server.conftest import unique

SENDS = 16
PACED_SENDS = 8  # a pause each: 12 s


def _pause() -> None:
    """Longer than a broker's writability answer lives in the proxy: the client's route
    query (which asks every broker) is too old to help the sends after it. The pause is
    the scenario (a producer sending now and then), not a wait for something."""
    time.sleep(WRITABLE_TTL_S * 1.5)  # the producer's pause, the scenario


def _owners(cluster: ClusterServer, topic: str) -> dict[int, str]:
    code, route = cluster.admin_call("GET", f"/v1/topics/{topic}/route")
    assert code == 200, route
    return {q["queue_id"]: q["broker"] for q in route["queues"]}  # type: ignore[index]


def _alternating_topic(cluster: ClusterServer, prefix: str, kind: str = "normal") -> str:
    topic = unique(prefix)
    cluster.create_topic(topic, kind, queues=4)
    owners = _owners(cluster, topic)
    placed = [owners[q] for q in range(4)]
    assert all(placed[q] != placed[q + 1] for q in range(3)), placed  # a,b,a,b or b,a,b,a
    return topic


def _landed(cluster: ClusterServer, topic: str) -> Counter[str]:
    """Messages stored per broker, from each queue's end offset."""
    code, status = cluster.admin_call("GET", f"/v1/topics/{topic}/status")
    assert code == 200, status
    owners = _owners(cluster, topic)
    landed: Counter[str] = Counter()
    for queue in status["queues"]:  # type: ignore[index]
        landed[owners[queue["queue_id"]]] += queue["max_offset"]
    return landed


def _evenly(landed: Counter[str], total: int) -> bool:
    """Both brokers took their half, give or take one send each: one draw per send puts
    exactly half on each (test_send_plan.py checks that exactly), but a broker slow to
    answer its writability on a loaded machine may have a send or two steered off it.
    Two draws per send put them all on one broker."""
    return sum(landed.values()) == total and all(
        abs(landed[b] - total // 2) <= 1 for b in ("broker-a", "broker-b")
    )


def _thread_plans(cluster: ClusterServer) -> float:
    with urllib.request.urlopen(cluster.admin + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(r'^halfmoon_proxy_send_plans_total\{path="thread"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_halfmoon_client_sends_alternate_between_the_brokers(cluster: ClusterServer) -> None:
    topic = _alternating_topic(cluster, "spread-hm")
    with SyncProducer(cluster.address) as producer:
        producer.send(Message(topic, b"first"))  # the client asks for the route
        _pause()
        before = _thread_plans(cluster)
        for i in range(SENDS - 1):
            producer.send(Message(topic, f"m{i}".encode()))
        thread_plans = _thread_plans(cluster) - before
    landed = _landed(cluster, topic)
    assert _evenly(landed, SENDS), landed
    # Each broker's writability was known when the sends came: planned on the event loop
    # (a few may not be, on a machine loaded enough to delay the proxy's refresh).
    assert thread_plans <= SENDS // 4, thread_plans


@pytest.mark.parametrize("paced", [False, True], ids=["back-to-back", "each-after-a-pause"])
def test_official_client_sends_alternate_between_the_brokers(
    cluster: ClusterServer, paced: bool
) -> None:
    """Paced: every send finds the proxy's writability answers older than they live, as
    sends 1.5 s apart did when each one drew twice from the rotation and all went to one
    broker (``b b b b b b b a a a …``)."""
    topic = _alternating_topic(cluster, "spread-rmq")
    sends = PACED_SENDS if paced else SENDS
    producer = Producer(ClientConfiguration(cluster.address, Credentials(), request_timeout=10))
    producer.startup()
    try:
        producer.send(message(topic, "first"))
        _pause()
        for i in range(sends - 1):
            producer.send(message(topic, f"m{i}"))
            if paced:
                _pause()
    finally:
        producer.shutdown()
    landed = _landed(cluster, topic)
    assert _evenly(landed, sends), landed


def test_transaction_group_members_spread_over_both_brokers(cluster: ClusterServer) -> None:
    topic = _alternating_topic(cluster, "spread-tx", "transaction")
    with SyncTransactionProducer(cluster.address, unique("spread-producers")) as producer:
        for _ in range(2):
            group = producer.client.begin_group()
            receipts = [producer.send_in(group, Message(topic, b"member"))]
            _pause()
            receipts += [producer.send_in(group, Message(topic, b"member")) for _ in range(7)]
            producer.commit(group)
            members = Counter(r.transaction_id.split(":", 1)[0] for r in receipts)
            assert _evenly(members, 8), members
    landed = _landed(cluster, topic)
    assert _evenly(landed, 16), landed
