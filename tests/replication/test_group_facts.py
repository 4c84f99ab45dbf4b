"""A broker group member republishes its facts (the disk figures ``cluster list`` shows): its
member key, and as master the group's routing entry, never once another member holds the
master key (``GroupMember._republish_facts``, every 30 s in its renewal loop)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.process_start import process_started_ms
from halfmoon.replication.coordination import GroupMember
from halfmoon.replication.keys import GroupKeys
from tests.cluster.etcd_server import EtcdServer


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _read(etcd: EtcdServer, key: str) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        async with EtcdClient.from_url(etcd.url) as client:
            found = await client.get(key)
            assert found is not None, key
            return json.loads(found.value)  # type: ignore[no-any-return]

    return asyncio.run(read())


def _member(etcd: EtcdServer, cluster: str, name: str, disk: dict[str, int]) -> GroupMember:
    return GroupMember(
        etcd.url, cluster, "g1", name, f"127.0.0.1:{len(name)}", ttl_s=10,
        facts={"data_dir": "/d"}, facts_source=lambda: dict(disk),
    )  # fmt: skip


def test_a_master_republishes_its_disk_in_the_routing_entry(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    keys = GroupKeys("facts-a", "g1")
    disk = {"disk_free_bytes": 100}
    member = _member(etcd, "facts-a", "b0", disk)
    try:
        member.join()
        elected = member.campaign(0)
        assert elected is not None
        assert member.announce(elected.epoch)  # serving: the routing entry is written
        route_key = keys.prefix.replace("broker-groups/g1/", "brokers/g1")
        first = _read(etcd, route_key)
        assert first["disk_free_bytes"] == 100 and first["started_ms"] == process_started_ms()
        disk["disk_free_bytes"] = 42
        member._run(member._republish_facts())
        route, own = _read(etcd, route_key), _read(etcd, keys.member("b0"))
        assert route["disk_free_bytes"] == own["disk_free_bytes"] == 42
        assert route["epoch"] == first["epoch"] and route["member"] == "b0"
        assert route["started_ms"] == first["started_ms"]
    finally:
        member.leave()


def test_a_deposed_master_leaves_the_routing_entry_alone(etcd: EtcdServer) -> None:
    keys = GroupKeys("facts-b", "g1")
    route_key = keys.prefix.replace("broker-groups/g1/", "brokers/g1")
    disk = {"disk_free_bytes": 100}
    old = _member(etcd, "facts-b", "b0", disk)
    try:
        old.join()
        elected = old.campaign(0)
        assert elected is not None
        assert old.announce(elected.epoch)

        # Another writer moves the master key (a controller appointing b1, say).
        async def move() -> None:
            async with EtcdClient.from_url(etcd.url) as client:
                found = await client.get(keys.master)
                assert found is not None
                await client.put(keys.master, found.value.replace(b'"b0"', b'"b1"'))

        asyncio.run(move())
        disk["disk_free_bytes"] = 7
        old._run(old._republish_facts())
        assert _read(etcd, route_key)["disk_free_bytes"] == 100  # untouched
        assert _read(etcd, keys.member("b0"))["disk_free_bytes"] == 7  # its own key: yes
    finally:
        old.leave()
