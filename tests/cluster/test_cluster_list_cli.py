"""``halfmoon cluster list --coordinator etcd://... --cluster NAME`` against real members."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.coordination.metadata import ClusterMetadata
from tests.cli.test_cli import failed, halfmoon, ok, table
from tests.cluster.etcd_server import EtcdServer, free_port
from tests.cluster.member_process import TTL, Member
from tests.waiting import wait_until


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for member in started:
        member.close()


def listing(etcd: EtcdServer, cluster: str) -> dict:  # type: ignore[type-arg]
    args = ("cluster", "list", "--coordinator", etcd.url, "--cluster", cluster, "--json")
    return json.loads(ok(halfmoon(*args)))


def test_cluster_list_shows_brokers_proxies_and_queues_from_etcd(
    etcd: EtcdServer, cluster_name: str, members: list[Member]
) -> None:
    # TTL 6 (renewals every 2 s): a loaded machine cannot delay one long enough to look late.
    members.append(Member(etcd.url, cluster_name, "b1", "127.0.0.1:1001", ttl_s=6))
    members.append(Member(etcd.url, cluster_name, "b2", "127.0.0.1:1002", ttl_s=6))
    members.append(Member(etcd.url, cluster_name, "p1", "127.0.0.1:2001", "proxy", ttl_s=6))

    async def create() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            await ClusterMetadata(client, cluster_name).create_topic("orders", queues=8)
            await ClusterMetadata(client, cluster_name).create_topic("pinned", brokers=["b1"])

    asyncio.run(create())
    data = listing(etcd, cluster_name)
    assert data["cluster"] == cluster_name
    brokers = {b["name"]: b for b in data["brokers"]}
    assert {n: (b["endpoint"], b["state"], b["queues"]) for n, b in brokers.items()} == {
        "b1": ("127.0.0.1:1001", "live", 4 + 8),
        "b2": ("127.0.0.1:1002", "live", 4),
    }
    assert [(p["name"], p["endpoint"], p["state"]) for p in data["proxies"]] == [
        ("p1", "127.0.0.1:2001", "live")
    ]
    rows = table(
        ok(halfmoon("cluster", "list", "--coordinator", etcd.url, "--cluster", cluster_name))
    )
    assert rows[0] == [
        "ROLE", "NAME", "ENDPOINT", "STATE", "LEASE", "QUEUES", "DISK-FREE", "DISK-USED", "HOST",
        "PID", "UPTIME",
    ]  # fmt: skip
    assert [r[:4] for r in rows[1:]] == [
        ["broker", "b1", "127.0.0.1:1001", "live"],
        ["broker", "b2", "127.0.0.1:1002", "live"],
        ["proxy", "p1", "127.0.0.1:2001", "live"],
    ]


def test_a_killed_member_leaves_the_list_after_its_ttl(
    etcd: EtcdServer, cluster_name: str, members: list[Member]
) -> None:
    members.append(Member(etcd.url, cluster_name, "b1", "127.0.0.1:1001"))
    members.append(Member(etcd.url, cluster_name, "b2", "127.0.0.1:1002"))
    members[0].kill()
    wait_until(
        lambda: "b1" not in {b["name"] for b in listing(etcd, cluster_name)["brokers"]},
        TTL + 5,
        "b1 to leave the list with its lease",
        interval=0.2,
    )
    assert [b["name"] for b in listing(etcd, cluster_name)["brokers"]] == ["b2"]
    members[1].terminate()
    out = ok(halfmoon("cluster", "list", "--coordinator", etcd.url, "--cluster", cluster_name))
    assert out == f"cluster {cluster_name!r}: no broker or proxy is registered\n"


def test_cluster_list_refuses_bad_input(etcd: EtcdServer) -> None:
    line = failed(halfmoon("cluster", "list", "--coordinator", "http://x:1", "--cluster", "c"))
    assert "(BAD_COORDINATOR_ADDRESS)" in line
    line = failed(halfmoon("cluster", "list", "--coordinator", etcd.url, "--cluster", "a/b"))
    assert "(BAD_CLUSTER_NAME)" in line
    assert "--cluster" in failed(halfmoon("cluster", "list", "--coordinator", etcd.url), status=2)
    dead = f"etcd://127.0.0.1:{free_port()}"
    line = failed(halfmoon("cluster", "list", "--coordinator", dead, "--cluster", "c"))
    assert "(COORDINATOR_UNAVAILABLE)" in line
    # The environment stands in for the flags.
    env = {"HALFMOON_COORDINATOR": etcd.url, "HALFMOON_CLUSTER": "empty"}
    assert json.loads(ok(halfmoon("cluster", "list", "--json", env=env)))["brokers"] == []


def test_a_member_that_stops_renewing_is_shown_late_until_it_renews_again(
    etcd: EtcdServer, cluster_name: str, members: list[Member]
) -> None:
    # TTL 6: renewals every 2 s; late once one is missed (3 s), gone at 6 s.
    members.append(Member(etcd.url, cluster_name, "b1", "127.0.0.1:1001", ttl_s=6))

    def state() -> str:
        return {b["name"]: b["state"] for b in listing(etcd, cluster_name)["brokers"]}["b1"]

    assert state() == "live"
    members[0].pause()  # alive but not renewing, as a process stuck or cut off
    wait_until(lambda: state() == "late", 5, "b1 to be shown late", interval=0.2)
    members[0].resume()
    wait_until(lambda: state() == "live", 5, "b1 to be shown live again", interval=0.2)
