"""The etcd client against a real etcd: key-values, compare-and-swap, leases, watches."""

from __future__ import annotations

import asyncio
import time

import pytest

from halfmoon.cluster.coordination.etcd import EtcdClient, WatchCompacted
from halfmoon.cluster.coordination.etcd_json import parse_coordinator, prefix_end, range_prefix_sync
from halfmoon.cluster.coordination.etcd_tls import PLAIN
from halfmoon.cluster.errors import BadCoordinatorAddress, CoordinatorUnavailable
from tests.cluster.etcd_server import EtcdServer, free_port


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_put_get_delete_and_prefix_reads(etcd: EtcdServer, cluster_name: str) -> None:
    prefix = f"/test/{cluster_name}/"

    async def scenario() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            assert await client.get(prefix + "a") is None
            revision = await client.put(prefix + "a", b"1")
            await client.put(prefix + "b", b"\x00\xff binary")
            await client.put(f"/test/{cluster_name}0", b"outside the prefix")
            kv = await client.get(prefix + "a")
            assert kv is not None and kv.value == b"1" and kv.mod_revision == revision
            kvs, read_at = await client.get_prefix(prefix)
            assert [(k.key, k.value) for k in kvs] == [
                (prefix + "a", b"1"),
                (prefix + "b", b"\x00\xff binary"),
            ]
            assert read_at >= revision
            assert await client.delete(prefix + "a") is True
            assert await client.delete(prefix + "a") is False
            assert await client.get(prefix + "a") is None

    run(scenario())
    kvs, _ = range_prefix_sync(parse_coordinator(etcd.url), prefix, tls=PLAIN)
    assert [k.key for k in kvs] == [prefix + "b"]


def test_create_is_a_compare_and_swap(etcd: EtcdServer, cluster_name: str) -> None:
    key = f"/test/{cluster_name}/topic"

    async def scenario() -> None:
        async with EtcdClient.from_url(etcd.url) as a, EtcdClient.from_url(etcd.url) as b:
            results = await asyncio.gather(
                *(client.create(key, f"v{i}".encode()) for i, client in enumerate([a, b] * 5))
            )
        created = [stored for made, stored in results if made]
        assert len(created) == 1
        assert {stored.value for _, stored in results} == {created[0].value}

    run(scenario())


def test_a_lease_expires_unless_kept_alive_and_revoke_deletes_at_once(
    etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            kept, dropped, revoked = [await client.grant_lease(2) for _ in range(3)]
            for name, lease in (("kept", kept), ("dropped", dropped), ("revoked", revoked)):
                await client.put(f"/test/{cluster_name}/{name}", b"x", lease=lease)
            assert await client.revoke_lease(revoked) is True
            assert await client.get(f"/test/{cluster_name}/revoked") is None
            deadline = time.monotonic() + 10
            while await client.get(f"/test/{cluster_name}/dropped") is not None:
                assert await client.keep_alive(kept) > 0
                assert time.monotonic() < deadline, "the lease never expired"
                await asyncio.sleep(0.3)
            assert await client.get(f"/test/{cluster_name}/kept") is not None
            assert await client.keep_alive(dropped) == 0
            assert await client.revoke_lease(dropped) is False

    run(scenario())


def test_a_watch_resumes_from_a_revision(etcd: EtcdServer, cluster_name: str) -> None:
    prefix = f"/test/{cluster_name}/"

    async def scenario() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            first = await client.put(prefix + "one", b"1")
            await client.put(prefix + "two", b"2")
            await client.delete(prefix + "one")
            seen: list[tuple[str, str]] = []
            async for batch in client.watch_prefix(prefix, first + 1):
                seen += [(e.kind, e.kv.key) for e in batch.events]
                if len(seen) >= 2:
                    break
            assert seen == [("PUT", prefix + "two"), ("DELETE", prefix + "one")]

    run(scenario())


def test_a_watch_from_a_compacted_revision_says_so(etcd: EtcdServer, cluster_name: str) -> None:
    prefix = f"/test/{cluster_name}/"

    async def scenario() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            old = await client.put(prefix + "k", b"1")
            latest = await client.put(prefix + "k", b"2")
            await client.call("/kv/compaction", {"revision": str(latest)})
            with pytest.raises(WatchCompacted) as caught:
                async for _ in client.watch_prefix(prefix, old):
                    pass
            assert caught.value.compact_revision == latest

    run(scenario())


def test_an_unreachable_etcd_is_a_coordinator_error(etcd: EtcdServer) -> None:
    dead = f"etcd://127.0.0.1:{free_port()}"

    async def scenario() -> None:
        async with EtcdClient.from_url(dead, timeout=2) as client:
            with pytest.raises(CoordinatorUnavailable):
                await client.get("/x")
            with pytest.raises(CoordinatorUnavailable):
                async for _ in client.watch_prefix("/x", 1):
                    pass
        # A dead endpoint listed first is skipped for a live one.
        async with EtcdClient.from_url(f"{dead},{etcd.address}", timeout=2) as client:
            assert await client.put("/test/failover", b"ok") > 0

    run(scenario())
    with pytest.raises(CoordinatorUnavailable):
        range_prefix_sync(parse_coordinator(dead), "/x", timeout=2, tls=PLAIN)


@pytest.mark.parametrize(
    "url",
    ["", "http://127.0.0.1:2379", "etcd://", "etcd://host", "etcd://host:port", "etcd://h:70000"],
)
def test_bad_coordinator_addresses_are_refused(url: str) -> None:
    with pytest.raises(BadCoordinatorAddress) as caught:
        parse_coordinator(url)
    assert caught.value.code == "BAD_COORDINATOR_ADDRESS"


def test_coordinator_addresses_and_prefix_ranges() -> None:
    assert parse_coordinator("etcd://a:1,b:2/") == ("http://a:1", "http://b:2")
    assert prefix_end("/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff") == b"\0"


def test_a_first_start_whose_port_was_taken_meanwhile_takes_fresh_ones(tmp_path) -> None:
    # The test etcd's ports are picked ahead; another process can bind one before etcd does.
    import socket

    from tests.cluster.etcd_server import EtcdServer

    server = EtcdServer(tmp_path / "etcd")
    holder = socket.socket()
    holder.bind(("127.0.0.1", server.client_port))
    holder.listen()
    taken = server.client_port
    try:
        server.start()
        assert server.client_port != taken
    finally:
        holder.close()
        server.stop()
