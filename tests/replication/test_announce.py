"""A master's routing entry (``brokers/<group>``, which proxies follow) is written by the master
itself once it serves (``GroupMember.announce``), never by the election: a proxy must not hear
of a master that cannot answer it yet."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from halfmoon.cluster.coordination.etcd import EtcdClient
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


def _get(etcd: EtcdServer, key: str) -> dict[str, object] | None:
    async def read() -> dict[str, object] | None:
        async with EtcdClient.from_url(etcd.url) as client:
            found = await client.get(key)
            return None if found is None else json.loads(found.value)

    return asyncio.run(read())


def test_an_elected_master_is_routed_to_only_once_it_announces_itself(etcd: EtcdServer) -> None:
    keys = GroupKeys("announce-a", "g1")
    member = GroupMember(etcd.url, "announce-a", "g1", "b0", "127.0.0.1:1", ttl_s=10)
    try:
        member.join()
        elected = member.campaign(0)
        assert elected is not None
        assert _get(etcd, keys.master) is not None
        assert _get(etcd, keys.route) is None  # elected, not serving yet: not routed to
        assert member.announce(elected.epoch)
        route = _get(etcd, keys.route)
        assert route is not None
        assert (route["member"], route["epoch"], route["endpoint"]) == ("b0", 1, "127.0.0.1:1")
    finally:
        member.leave()


def test_a_master_whose_key_moved_meanwhile_does_not_announce_itself(etcd: EtcdServer) -> None:
    keys = GroupKeys("announce-b", "g1")
    member = GroupMember(etcd.url, "announce-b", "g1", "b0", "127.0.0.1:1", ttl_s=10)
    try:
        member.join()
        elected = member.campaign(0)
        assert elected is not None

        async def move() -> None:  # a controller appointing b1 while b0 still opened
            async with EtcdClient.from_url(etcd.url) as client:
                found = await client.get(keys.master)
                assert found is not None
                await client.put(keys.master, found.value.replace(b'"b0"', b'"b1"'))

        asyncio.run(move())
        assert not member.announce(elected.epoch)
        assert _get(etcd, keys.route) is None
    finally:
        member.leave()
