"""The dashboard on a proxy of a real cluster (etcd, two brokers, two proxies, each its own
process): a message's trace gathered from the broker that holds it, and the Overview's
warning when a broker is SIGKILLed — unreachable at once, down once its lease is gone —
or when a replica of a replicated broker group is."""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from halfmoon.client.selector import MessageSelector
from halfmoon.client.sync import SyncSimpleConsumer
from tests.cluster.cluster_server import ClusterServer
from tests.dashboard.conftest import dashboard_in
from tests.replication.group_cluster import GroupCluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterServer]:
    server = ClusterServer(tmp_path / "cluster", broker_lease_ttl=2).start()  # a lease runs out
    try:
        yield server
    finally:
        server.kill()


def test_trace_through_a_proxy_and_a_killed_broker_on_the_overview(
    cluster: ClusterServer, browser: Any, shots: Path
) -> None:
    topic, group = f"spread-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, queues=4)  # two queues on each broker
    cluster.create_group(group)
    status, sent = cluster.admin_call("POST", f"/v1/topics/{topic}/messages", {"body": "x"})
    assert status == 201, sent
    with SyncSimpleConsumer(cluster.address, group, {topic: MessageSelector.all()}) as consumer:
        got: list = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = consumer.receive(1, 15, wait=2)
        assert len(got) == 1
        consumer.ack(got[0])
    status, trace = cluster.admin_call("GET", f"/v1/messages/{sent['message_id']}/trace")
    assert status == 200, trace
    events = [(e["event"], e.get("group"), e.get("broker")) for e in trace["events"]]
    holder = events[-1][2]
    assert holder in ("broker-a", "broker-b")
    assert events == [
        ("stored", None, None),
        ("delivered", group, holder),
        ("acked", group, holder),
    ]

    # The trace switch, through the proxy: kept in etcd and on each broker holding the topic.
    status, changed = cluster.admin_call("PATCH", f"/v1/topics/{topic}", {"trace": False})
    assert status == 200 and changed["trace"] is False, changed
    status, shown = cluster.proxies[1].admin_call("GET", f"/v1/topics/{topic}")
    assert shown["trace"] is False
    status, quiet = cluster.admin_call("POST", f"/v1/topics/{topic}/messages", {"body": "y"})
    with SyncSimpleConsumer(cluster.address, group, {topic: MessageSelector.all()}) as consumer:
        got = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = consumer.receive(1, 15, wait=2)
        assert len(got) == 1
        consumer.ack(got[0])
    status, trace = cluster.admin_call("GET", f"/v1/messages/{quiet['message_id']}/trace")
    assert [e["event"] for e in trace["events"]] == ["stored"]

    # Every proxy serves the dashboard, each on its own admin listener.
    for proxy in cluster.proxies:
        with urllib.request.urlopen(proxy.admin + "/dashboard/", timeout=10) as response:
            assert response.headers.get_content_type() == "text/html"
            assert b"/dashboard/dashboard.js" in response.read()
    pages = dashboard_in(browser, cluster, shots)
    dashboard = next(pages)
    page = dashboard.open("overview", "overview")
    assert "broker-b" in page.locator("main table").last.inner_text()
    proxies = page.locator("#proxies table").inner_text()  # both proxies, live, with endpoints
    for proxy in cluster.proxies:
        assert f"proxy-{proxy.grpc_port}" in proxies and proxy.address in proxies, proxies
    assert proxies.count("live") == len(cluster.proxies), proxies
    assert "broker broker-b" not in page.locator("#warnings").inner_text()
    cluster.brokers[1].kill()  # SIGKILL: no deregistration, its lease runs out by itself
    # The overview redraws every 5 s: first the proxy cannot reach it, then its lease is gone.
    page.wait_for_selector("#warnings li:has-text('broker broker-b is down: its lease is gone')",
                           timeout=45_000)  # fmt: skip
    warning = page.locator("#warnings li", has_text="broker broker-b is down").inner_text()
    assert "2 queue(s) unavailable" in warning
    row = page.locator("main table").last.locator("tr", has_text="broker-b")
    assert "down" in row.inner_text()
    assert "broker broker-a" not in page.locator("#warnings").inner_text()
    dashboard.screenshot("overview-broker-down")
    # The refused calls to the killed broker are the proxy's business: the page logs nothing.
    with pytest.raises(StopIteration):
        next(pages)  # closes the context; fails on any console error


def test_a_killed_replica_is_warned_about_on_the_overview(
    browser: Any, tmp_path: Path, shots: Path
) -> None:
    """A broker group (master, two replicas, sync, at least two in sync) behind a proxy: a
    SIGKILLed replica leaves the in-sync set, and the Overview says sync sends are refused."""
    group = GroupCluster(tmp_path / "group", mode="sync", min_insync=2).start()
    try:
        assert group.proxy is not None
        pages = dashboard_in(browser, group.proxy, shots)  # type: ignore[arg-type]
        dashboard = next(pages)
        page = dashboard.open("overview", "overview")
        page.wait_for_selector("#broker-groups td:has-text('b1, b2')", timeout=30_000)
        # Replication lag per replica, as the master reports it, through the proxy's API...
        status, answer = group.proxy.admin_call("GET", "/v1/cluster")
        assert status == 200, answer
        (shown,) = answer["broker_groups"]
        assert set(shown["replicas"]) == {"b1", "b2"}, shown
        assert all(isinstance(p["lag_bytes"], int) for p in shown["replicas"].values()), shown
        # ...and on the page.
        page.wait_for_selector("#broker-groups td:has-text('b1: ')", timeout=30_000)
        lag = page.locator("#broker-groups tbody tr").first.inner_text().split("\t")[7]
        assert "b1: " in lag and "b2: " in lag, lag
        assert "broker group" not in page.locator("#warnings").inner_text()
        # The Cluster page: the group's master and replicas, its epoch, each replica's lag.
        page = dashboard.open("cluster", "cluster")
        section = page.locator("section.broker-group[data-group='g1']")
        # Each replica's lag as the master reports it (the page redraws every 5 s).
        page.wait_for_function(
            """() => [...document.querySelectorAll("section.broker-group tbody tr")]
                .filter((tr) => tr.cells[1].textContent === "replica" && tr.cells[5].textContent)
                .length === 2"""
        )
        facts = section.locator("p").inner_text()
        assert f"master b0, epoch {shown['epoch']}" in facts and "sync replication" in facts, facts
        assert "at least 2 in sync" in facts, facts
        members = cluster_members(section)
        assert members["b0"][:2] == ["master", "live"], members
        for replica in ("b1", "b2"):
            role, state, in_sync, connected, lag_bytes = members[replica][:5]
            assert (role, state, in_sync, connected) == ("replica", "live", "yes", "yes"), members
            assert lag_bytes.endswith("B"), members  # e.g. "0 KiB"
        dashboard.screenshot("cluster-broker-group")
        page = dashboard.open("overview", "overview")
        group.replicas[1].kill()  # SIGKILL
        page.wait_for_selector(
            "#warnings li:has-text('broker group g1 has 1 in-sync replica(s), fewer than its "
            "minimum 2: sync sends are refused')",
            timeout=45_000,
        )
        row = page.locator("#broker-groups tbody tr").first.inner_text()
        assert "b2" not in row.split("\t")[4]  # no longer in the in-sync set
        dashboard.screenshot("overview-replica-down")
        # The Cluster page says the same: b2 out of the in-sync set, and the warning.
        page = dashboard.open("cluster", "cluster")
        page.wait_for_selector("#cluster-warnings li:has-text('sync sends are refused')")
        # b2 stays listed while its master still reports on it: down, out of sync, cut off.
        section = page.locator("section.broker-group[data-group='g1']")
        page.wait_for_function(
            """() => [...document.querySelectorAll("section.broker-group tbody tr")].some((tr) =>
                tr.cells[0].textContent === "b2" && tr.cells[2].textContent === "down"
                && tr.cells[3].textContent === "no")""",
            timeout=30_000,
        )
        members = cluster_members(section)
        assert members["b2"][:4] == ["replica", "down", "no", "no"], members
        assert members["b1"][:4] == ["replica", "live", "yes", "yes"], members
        with pytest.raises(StopIteration):
            next(pages)  # closes the context; fails on any console error
    finally:
        group.kill()


def cluster_members(section: Any) -> dict[str, list[str]]:
    """A broker group's table on the Cluster page: member -> role, state, in sync,
    connected, replication lag, lag in time."""
    rows = section.locator("tbody tr")
    cells = [rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())]
    return {row[0]: row[1:] for row in cells}
