"""A real ``halfmoon broker`` in the cluster: listed while it runs, gone after SIGKILL + its TTL."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import pytest

from halfmoon.broker_node import advertised_address
from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.coordination.metadata import ClusterMetadata
from halfmoon.cluster.proxy.cluster_proxy import ProxyIdentity
from halfmoon.config import Config
from halfmoon.errors import HalfmoonError
from halfmoon.listen.addresses import format_address
from tests.cli.test_cli import failed, halfmoon, ok
from tests.cluster.broker_processes import BrokerProcess
from tests.cluster.etcd_server import EtcdServer
from tests.waiting import wait_until

TTL = 3  # short, yet a renewal (every second) delayed by load does not look late


def listed(etcd: EtcdServer, cluster: str) -> dict[str, dict]:  # type: ignore[type-arg]
    args = ("cluster", "list", "--coordinator", etcd.url, "--cluster", cluster, "--json")
    return {b["name"]: b for b in json.loads(ok(halfmoon(*args)))["brokers"]}


def test_a_started_broker_is_listed_and_leaves_after_sigkill_and_its_ttl(
    tmp_path: Path, etcd: EtcdServer, cluster_name: str
) -> None:
    extra = ("--cluster", cluster_name, "--coordinator", etcd.url, "--lease-ttl", str(TTL))
    broker = BrokerProcess(tmp_path / "data", name="b1", extra=extra).start()
    try:
        member = listed(etcd, cluster_name)["b1"]
        assert (member["endpoint"], member["state"]) == (broker.address, "live")
        assert member["pid"] == broker.pid and member["ttl_s"] == TTL
        assert member["data_dir"] == str((tmp_path / "data").resolve())
        assert member["disk_free_bytes"] > 0 and 0 <= member["disk_used_ratio"] <= 1

        async def place() -> None:
            async with EtcdClient.from_url(etcd.url) as client:
                await ClusterMetadata(client, cluster_name).create_topic("orders", queues=4)

        asyncio.run(place())
        assert listed(etcd, cluster_name)["b1"]["queues"] == 4

        broker.kill()
        # Its lease expires; it holds queues, so it stays listed as gone (unavailable).
        wait_until(
            lambda: listed(etcd, cluster_name)["b1"]["state"] == "gone",
            TTL + 5,
            "the killed broker to be listed as gone",
            interval=0.2,
        )
        assert listed(etcd, cluster_name)["b1"]["queues"] == 4

        broker.start()
        assert listed(etcd, cluster_name)["b1"]["pid"] == broker.pid

        # Killed and restarted on the same address before its lease expired: the new
        # process takes the entry over at once, and the old lease cannot remove it later.
        broker.kill()
        broker.start()
        assert listed(etcd, cluster_name)["b1"]["pid"] == broker.pid
        time.sleep(TTL + 1)  # past the old lease's TTL: what is asserted is that nothing changed
        member = listed(etcd, cluster_name)["b1"]
        assert member["pid"] == broker.pid and member["state"] == "live"
    finally:
        broker.kill()


def test_broker_registration_input_is_checked_before_the_store_opens(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    def broker(*args: str) -> str:
        result = halfmoon("broker", "--data-dir", str(tmp_path / "data"), *args)
        return failed(result, status=2)

    assert "(BAD_COORDINATOR_ADDRESS)" in broker("--cluster", "c", "--coordinator", "http://x:1")
    assert "(BAD_CLUSTER_NAME)" in broker("--cluster", "a/b", "--coordinator", etcd.url)
    assert "--lease-ttl" in broker("--cluster", "c", "--coordinator", etcd.url, "--lease-ttl", "1")
    assert not (tmp_path / "data").exists()


def test_the_registered_endpoint_is_one_a_proxy_can_dial() -> None:
    machine = socket.getfqdn()
    assert advertised_address("127.0.0.1:8091", None) == "127.0.0.1:8091"
    assert advertised_address("0.0.0.0:8091", None) == f"{machine}:8091"
    assert advertised_address("[::]:8091", None) == format_address(machine, 8091)
    assert advertised_address("0.0.0.0:8091", "b1.internal") == "b1.internal:8091"
    assert advertised_address("0.0.0.0:8091", "fd00::1") == "[fd00::1]:8091"


def test_a_proxy_registers_an_endpoint_and_a_name_a_client_can_dial() -> None:
    """The proxy's endpoint follows the broker's rule (advertised host, else listen host,
    else this machine's name), IPv6 in brackets; its name is made of it unless configured."""
    machine = socket.getfqdn()

    def identity(
        listen: str, advertise: str | None = None, name: str | None = None
    ) -> tuple[str, str]:
        config = Config()
        config.server.listen, config.server.advertise_host = listen, advertise
        config.cluster.name, config.cluster.coordinator = "c", "etcd://127.0.0.1:2379"
        config.cluster.proxy_name = name
        found = ProxyIdentity.from_config(config)
        return found.endpoint, found.name

    assert identity("127.0.0.1:8081") == ("127.0.0.1:8081", "127.0.0.1-8081")
    assert identity("0.0.0.0:8081")[0] == f"{machine}:8081"
    assert identity("[::]:8081", "fd00::2") == ("[fd00::2]:8081", "fd00--2-8081")
    assert identity("0.0.0.0:8081", "p1.internal", "edge-1") == ("p1.internal:8081", "edge-1")
    with pytest.raises(HalfmoonError, match="BAD_NAME|name"):
        identity("127.0.0.1:8081", name="a/b")
