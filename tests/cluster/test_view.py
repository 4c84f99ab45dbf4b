"""The watched cache against a real etcd: latency, member expiry, etcd crashes, compaction."""

from __future__ import annotations

import asyncio
import time

import pytest

from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.coordination.membership import Membership
from halfmoon.cluster.coordination.metadata import ClusterMetadata
from halfmoon.cluster.coordination.view import ClusterView
from halfmoon.cluster.errors import CoordinatorUnavailable
from tests.cluster.etcd_server import EtcdServer, free_port

LATENCY_BOUND_S = 1.0


def test_a_change_made_anywhere_reaches_every_view_within_a_second(
    etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario() -> list[float]:
        clients = [EtcdClient.from_url(etcd.url) for _ in range(3)]
        views = [ClusterView(c, cluster_name) for c in clients[1:]]
        meta = ClusterMetadata(clients[0], cluster_name)
        broker = Membership(clients[0], cluster_name, "broker", "a", "127.0.0.1:1")
        latencies = []
        try:
            for view in views:
                await view.start()
            await broker.start()
            for view in views:
                await view.wait_for(lambda v: "a" in v.brokers, LATENCY_BOUND_S)
            for i in range(10):
                started = time.monotonic()
                await meta.create_topic(f"topic{i}", queues=2)
                await meta.set_setting("round", i)
                for view in views:
                    await view.wait_for(
                        lambda v, i=i: f"topic{i}" in v.topics and v.setting("round") == i,
                        LATENCY_BOUND_S,
                    )
                latencies.append(time.monotonic() - started)
            await meta.delete_topic("topic0")
            for view in views:
                await view.wait_for(lambda v: "topic0" not in v.topics, LATENCY_BOUND_S)
            assert views[0].topic("topic1") == await meta.get_topic("topic1")
        finally:
            await broker.stop()
            for view in views:
                await view.stop()
            for c in clients:
                await c.close()
        return latencies

    latencies = asyncio.run(scenario())
    assert max(latencies) < LATENCY_BOUND_S
    print(
        f"view latency: median {sorted(latencies)[5] * 1000:.1f} ms, max "
        f"{max(latencies) * 1000:.1f} ms"
    )


def test_a_route_names_each_queues_broker_endpoint_while_it_is_live(
    etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            a = Membership(client, cluster_name, "broker", "a", "127.0.0.1:1")
            b = Membership(client, cluster_name, "broker", "b", "127.0.0.1:2")
            await a.start()
            await b.start()
            view = ClusterView(client, cluster_name)
            await view.start()
            await ClusterMetadata(client, cluster_name).create_topic("orders", brokers=["a", "b"])
            await view.wait_for(lambda v: v.route("orders") is not None, LATENCY_BOUND_S)
            route = view.route("orders")
            assert route is not None and len(route) == 8
            assert {(q.broker, q.endpoint) for q in route} == {
                ("a", "127.0.0.1:1"),
                ("b", "127.0.0.1:2"),
            }
            await b.stop()
            await view.wait_for(lambda v: "b" not in v.brokers, LATENCY_BOUND_S)
            route = view.route("orders")
            assert route is not None
            assert {q.endpoint for q in route if q.broker == "b"} == {None}
            assert {q.endpoint for q in route if q.broker == "a"} == {"127.0.0.1:1"}
            assert view.route("missing") is None
            await a.stop()
            await view.stop()

    asyncio.run(scenario())


def test_a_view_sees_a_member_expire(etcd: EtcdServer, cluster_name: str) -> None:
    async def scenario() -> None:
        async with EtcdClient.from_url(etcd.url) as client, EtcdClient.from_url(etcd.url) as other:
            view = ClusterView(client, cluster_name)
            await view.start()
            member = Membership(other, cluster_name, "proxy", "p1", "127.0.0.1:1", ttl_s=2)
            await member.start()
            await view.wait_for(lambda v: "p1" in v.proxies, LATENCY_BOUND_S)
            assert view.proxies["p1"]["endpoint"] == "127.0.0.1:1"
            # Stop renewing without revoking: the process "died"; etcd expires the lease.
            assert member._renewer is not None
            member._renewer.cancel()
            await view.wait_for(lambda v: "p1" not in v.proxies, 2 + 3)
            await view.stop()

    asyncio.run(scenario())


def test_the_view_survives_an_etcd_crash_and_resyncs(
    own_etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario() -> None:
        async with (
            EtcdClient.from_url(own_etcd.url) as writer,
            EtcdClient.from_url(own_etcd.url) as reader,
        ):
            meta = ClusterMetadata(writer, cluster_name)
            await meta.set_setting("before", 1)
            view = ClusterView(reader, cluster_name)
            await view.start()
            assert view.setting("before") == 1 and view.synced

            own_etcd.kill()
            await view.wait_for(lambda v: not v.synced, 5)
            assert view.setting("before") == 1, "the cached view keeps answering while etcd is down"
            await asyncio.sleep(0.5)  # several failed reconnects
            assert view.setting("before") == 1

            await asyncio.to_thread(own_etcd.restart)
            await view.wait_for(lambda v: v.synced, 10)
            assert view.resyncs >= 1
            await meta.set_setting("after", 2)
            await meta.delete_setting("before")
            await view.wait_for(
                lambda v: v.setting("after") == 2 and v.setting("before") is None, LATENCY_BOUND_S
            )
            await view.stop()

    asyncio.run(scenario())


def test_a_hung_etcd_marks_the_view_stale_and_it_resyncs_when_etcd_answers(
    own_etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario() -> None:
        async with (
            EtcdClient.from_url(own_etcd.url) as writer,
            EtcdClient.from_url(own_etcd.url, timeout=2) as reader,
        ):
            meta = ClusterMetadata(writer, cluster_name)
            await meta.set_setting("before", 1)
            view = ClusterView(reader, cluster_name, heartbeat_s=0.5)
            await view.start()
            own_etcd.pause()
            try:
                # The watch's connection stays open and silent; the heartbeat notices.
                await view.wait_for(lambda v: not v.synced, 5)
                assert view.setting("before") == 1
            finally:
                own_etcd.resume()
            await view.wait_for(lambda v: v.synced, 10)
            await meta.set_setting("after", 2)
            await view.wait_for(lambda v: v.setting("after") == 2, LATENCY_BOUND_S)
            await view.stop()

    asyncio.run(scenario())


def test_changes_made_while_the_watch_was_down_are_seen_by_relisting(
    own_etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario() -> None:
        async with (
            EtcdClient.from_url(own_etcd.url) as writer,
            EtcdClient.from_url(own_etcd.url) as reader,
        ):
            meta = ClusterMetadata(writer, cluster_name)
            await meta.set_setting("gone", 1)
            view = ClusterView(reader, cluster_name, retry_s=1.0)
            await view.start()
            own_etcd.kill()
            await view.wait_for(lambda v: not v.synced, 5)
            await asyncio.to_thread(own_etcd.restart)
            # Changed and compacted before the view reconnects: a resumed watch could not see
            # the delete; the re-list does.
            await meta.delete_setting("gone")
            latest = await writer.put("/unrelated", b"x")
            await writer.call("/kv/compaction", {"revision": str(latest)})
            await view.wait_for(lambda v: v.synced and v.setting("gone") is None, 10)
            await view.stop()

    asyncio.run(scenario())


def test_a_view_of_an_unreachable_etcd_says_so() -> None:
    async def scenario() -> None:
        async with EtcdClient.from_url(f"etcd://127.0.0.1:{free_port()}", timeout=1) as client:
            view = ClusterView(client, "c")
            with pytest.raises(CoordinatorUnavailable):
                await view.start(first_sync_timeout=1.5)
            assert view.brokers == {} and not view.synced
            await view.stop()

    asyncio.run(scenario())
