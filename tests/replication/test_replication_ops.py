"""What operators see of a broker group, with real processes: metrics, ``cluster list``,
the proxy's ``GET /v1/cluster``.

etcd, a master and two replicas (async replication, so a stopped replica only
lags), a proxy, the official Python client. Checked: the proxy's ``/metrics``
gives each replica's lag in bytes and milliseconds (0 when caught up, growing
while one is SIGSTOPped), the epoch, the in-sync count, and the failovers the
controller made, planned (``cluster failover``) and automatic (the master
SIGKILLed); ``cluster list`` and ``GET /v1/cluster`` show each group's master,
epoch, in-sync set and every replica's lag.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.replication.group_cluster import CLUSTER, GroupCluster, role, running, status
from tests.replication.test_group_replication import message, producer
from tests.replication.test_switchover import failover, halfmoon
from tests.waiting import wait_until

SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")


@pytest.fixture
def group(tmp_path: Path) -> Iterator[GroupCluster]:
    with running(GroupCluster(tmp_path / "group", mode="async", min_insync=0)) as cluster:
        yield cluster


def scrape(group: GroupCluster) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The proxy's replication metrics: (name, labels) → value."""
    assert group.proxy is not None
    url = f"http://127.0.0.1:{group.proxy.admin_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    samples = {}
    for line in text.splitlines():
        found = SAMPLE.match(line)
        if found and found.group(1).startswith("halfmoon_replication_"):
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', found.group(2) or ""))
            samples[(found.group(1), labels)] = float(found.group(3))
    return samples


def metric(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def failovers(samples: dict, kind: str) -> float | None:
    return metric(samples, "halfmoon_replication_failovers_total", group="g1", kind=kind)


def cluster_view(group: GroupCluster) -> dict:
    assert group.proxy is not None
    url = f"http://127.0.0.1:{group.proxy.admin_port}/v1/cluster"
    with urllib.request.urlopen(url, timeout=10) as answer:
        found = json.loads(answer.read())
    return found["broker_groups"][0]


def test_lag_epoch_in_sync_and_failovers_are_exported_and_listed(group: GroupCluster) -> None:
    wait_until(lambda: status(group.master)["isr"] == ["b1", "b2"], 15, "both replicas in sync")
    assert group.proxy is not None
    group.proxy.create_topic("orders", "normal", queues=2)
    client = producer(group, "orders")
    try:
        for i in range(20):
            client.send(message("orders", i))
        caught_up = wait_until(
            lambda: (
                (s := scrape(group))
                and metric(s, "halfmoon_replication_lag_bytes", group="g1", replica="b1") == 0
                and metric(s, "halfmoon_replication_lag_bytes", group="g1", replica="b2") == 0
                and s
            ),
            15,
            "both replicas caught up in the metrics",
        )
        assert metric(caught_up, "halfmoon_replication_epoch", group="g1") == 1
        assert metric(caught_up, "halfmoon_replication_in_sync_replicas", group="g1") == 2
        assert metric(caught_up, "halfmoon_replication_master_up", group="g1") == 1
        assert metric(caught_up, "halfmoon_replication_lag_ms", group="g1", replica="b1") == 0
        for kind in ("automatic", "planned"):
            assert failovers(caught_up, kind) == 0

        group.brokers[2].pause()  # SIGSTOP: b2 holds what it has, the master writes on
        try:
            for i in range(20, 60):
                client.send(message("orders", i))
            lagging = wait_until(
                lambda: (
                    (s := scrape(group))
                    and (metric(s, "halfmoon_replication_lag_bytes", group="g1", replica="b2") or 0)
                    > 0
                    and (metric(s, "halfmoon_replication_lag_ms", group="g1", replica="b2") or 0)
                    > 0
                    and s
                ),
                15,
                "b2's lag in bytes and ms",
            )
            assert metric(lagging, "halfmoon_replication_lag_bytes", group="g1", replica="b1") == 0
            view = cluster_view(group)
            assert view["master"] == "b0" and view["epoch"] == 1
            assert view["replicas"]["b2"]["lag_bytes"] > 0
            assert view["replicas"]["b1"]["lag_bytes"] == 0
            listed = halfmoon(
                "cluster", "list", "--coordinator", group.etcd.url, "--cluster", CLUSTER
            )
            assert listed.returncode == 0, listed.stderr
            print(listed.stdout)
            assert "REPLICA LAG" in listed.stdout
            row = next(line for line in listed.stdout.splitlines() if line.startswith("g1 "))
            assert "b1 0 B/0ms" in row, row
            assert re.search(r"b2 [1-9][\d.]* (B|KiB)/\d+ms", row), row
        finally:
            group.brokers[2].resume()
    finally:
        client.shutdown()
    wait_until(lambda: status(group.master)["isr"] == ["b1", "b2"], 20, "b2 back in sync")

    done = failover(group, "--to", "b1")
    assert done.returncode == 0, done.stderr
    planned = wait_until(
        lambda: (s := scrape(group)) and failovers(s, "planned") == 1 and s,
        15,
        "the planned failover counted",
    )
    assert metric(planned, "halfmoon_replication_epoch", group="g1") == 2
    assert failovers(planned, "automatic") == 0

    wait_until(
        lambda: role(group.brokers[0], timeout=1.0) == "replica", 30, "b0 to rejoin as a replica"
    )
    wait_until(lambda: sorted(status(group.brokers[1])["isr"]) == ["b0", "b2"], 30, "all in sync")
    group.brokers[1].kill()  # the new master SIGKILLed: its lease expires, a controller acts
    automatic = wait_until(
        lambda: (
            (s := scrape(group))
            and failovers(s, "automatic") == 1
            and metric(s, "halfmoon_replication_master_up", group="g1") == 1
            and s
        ),
        30,
        "the automatic failover counted",
    )
    assert metric(automatic, "halfmoon_replication_epoch", group="g1") == 3
    assert failovers(automatic, "planned") == 1
