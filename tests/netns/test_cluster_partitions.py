"""Cluster mode on a real (virtual) network: etcd, two brokers and a proxy, a host each.

- A broker cut off from etcd loses its lease: the proxy stops routing to it
  within the lease's TTL (plus the watch's latency), and sends to its queues
  fail at once with a retryable code; healed, it registers again and serves.
- A proxy cut off from a broker answers sends for that broker's queues with a
  retryable error within its deadline to brokers, rather than leaving them
  hanging; healed, traffic flows.
- Random loss on the proxy's links to the brokers (and delay, where the kernel
  has ``netem``) loses no acknowledged message and duplicates none: counted
  exactly with the official client. ``HALFMOON_NETNS_MESSAGES`` sets how many
  (default 200; the long version: thousands).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

from tests.cluster.cluster_server import wait_until
from tests.netns.cluster import LEASE_TTL_S, NetCluster
from tests.netns.network import VirtualNetwork, netem_available
from tests.netns.sends import RETRYABLE, RawSender
from tests.server.conftest import ROOT

MESSAGES = int(os.environ.get("HALFMOON_NETNS_MESSAGES", "200"))
# The proxy's deadline on a call to a broker
# (halfmoon.cluster.internal.connection.DEFAULT_TIMEOUT_S).
BROKER_DEADLINE_S = 10.0
# The proxy's deadline on a send to a broker (halfmoon.cluster.internal.connection.SEND_TIMEOUT_S).
SEND_DEADLINE_S = 5.0


@pytest.fixture
def cluster(network: VirtualNetwork, tmp_path: Path) -> Iterator[NetCluster]:
    started = NetCluster(network, tmp_path).start()
    try:
        started.proxy.create_topic("spread", "normal", queues=4)
        done = cli("topic", "create", "on-a", "--queues", "2", "--brokers", "broker-a",
                   "--admin", started.proxy.admin)  # fmt: skip
        assert done.returncode == 0, done.stderr
        yield started
    finally:
        started.kill()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "halfmoon", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def brokers_seen_by_proxy(cluster: NetCluster) -> set[str]:
    """The brokers registered (under a live lease) as the proxy sees them; a broker that only
    holds queues is listed as ``gone``."""
    done = cli("cluster", "list", "--json", "--admin", cluster.proxy.admin)
    assert done.returncode == 0, done.stderr
    brokers = json.loads(done.stdout)["brokers"]
    return {broker["name"] for broker in brokers if broker.get("state") != "gone"}


def test_a_broker_cut_off_from_etcd_is_dropped_within_its_lease_and_serves_again_after_healing(
    cluster: NetCluster, network: VirtualNetwork
) -> None:
    sender = RawSender(cluster.proxy.address)
    try:
        assert sender.send("on-a", "before").ok
        cut = time.monotonic()
        network.partition("broker-a", "etcd1")
        wait_until(lambda: "broker-a" not in brokers_seen_by_proxy(cluster),
                   LEASE_TTL_S + 3, "the proxy to drop broker-a")  # fmt: skip
        dropped_after = time.monotonic() - cut
        assert dropped_after <= LEASE_TTL_S + 3
        assert brokers_seen_by_proxy(cluster) == {"broker-b"}
        # No route to it: a send for its queues fails at once, with a code clients retry.
        refused = sender.send("on-a", "while-cut")
        assert refused.code in RETRYABLE and refused.seconds < 2, refused
        # The other broker serves on.
        assert sender.send("spread", "elsewhere").ok
        network.heal()
        healed = time.monotonic()
        wait_until(lambda: "broker-a" in brokers_seen_by_proxy(cluster), 15,
                   "broker-a to register again")  # fmt: skip
        back_after = time.monotonic() - healed
        wait_until(lambda: sender.send("on-a", "after").ok, 10, "a send to broker-a's queues")
    finally:
        sender.close()
    print(f"dropped {dropped_after:.2f} s after the cut, back {back_after:.2f} s after healing")


def test_a_proxy_cut_off_from_a_broker_answers_with_a_retryable_error_and_recovers(
    cluster: NetCluster, network: VirtualNetwork
) -> None:
    sender = RawSender(cluster.proxy.address)
    try:
        assert sender.send("on-a", "before").ok
        network.partition("proxy", "broker-a")
        attempts = [
            sender.send("on-a", f"cut-{i}", timeout=BROKER_DEADLINE_S + 5) for i in range(3)
        ]
        network.heal()
        wait_until(lambda: sender.send("on-a", "after").ok, 15, "a send to broker-a after healing")
    finally:
        sender.close()
    print("while cut: " + ", ".join(f"{a.code} after {a.seconds:.2f} s" for a in attempts))
    for attempt in attempts:
        assert attempt.code in RETRYABLE, attempts
        assert attempt.seconds <= SEND_DEADLINE_S + 1, attempts


def test_loss_between_proxy_and_brokers_loses_and_duplicates_no_acknowledged_message(
    cluster: NetCluster, network: VirtualNetwork
) -> None:
    cluster.proxy.create_group("counted")
    for name in ("broker-a", "broker-b"):
        network.lose("proxy", name, 10)
        if netem_available():
            network.delay(name, 20, 5)
    config = ClientConfiguration(cluster.proxy.address, Credentials(), request_timeout=10)
    producer = Producer(config, ("spread",))
    producer.startup()
    acknowledged: list[str] = []
    failed: list[str] = []
    try:
        for i in range(MESSAGES):
            message = Message()
            message.topic = "spread"
            message.body = f"m-{i}".encode()
            try:
                producer.send(message)
                acknowledged.append(f"m-{i}")
            except Exception:  # noqa: BLE001  # an unknown outcome: may be stored, or not
                failed.append(f"m-{i}")
    finally:
        producer.shutdown()
    faults = network.faults
    network.heal()  # consume over a clean network: the count is about the sends
    consumer = SimpleConsumer(config, "counted", {"spread": FilterExpression()}, await_duration=2)
    consumer.startup()
    delivered: Counter[str] = Counter()
    try:
        deadline = time.monotonic() + 60
        while not set(acknowledged) <= set(delivered) and time.monotonic() < deadline:
            for received in consumer.receive(32, 30):
                delivered[received.body.decode()] += 1
                consumer.ack(received)
        # Anything else still to come (a duplicate) within one more empty receive.
        for received in consumer.receive(32, 30):
            delivered[received.body.decode()] += 1
            consumer.ack(received)
    finally:
        consumer.shutdown()
    total = sum(delivered.values())
    print(f"sent {MESSAGES}: {len(acknowledged)} acknowledged, {len(failed)} failed; "
          f"delivered {total} ({len(delivered)} distinct); faults {faults}")  # fmt: skip
    assert len(acknowledged) >= MESSAGES * 0.9  # 10 % loss slows sends; it does not fail them
    missing = set(acknowledged) - set(delivered)
    assert not missing, sorted(missing)[:10]
    twice = {body: n for body, n in delivered.items() if n > 1}
    assert not twice, twice
    assert set(delivered) <= set(acknowledged) | set(failed)
