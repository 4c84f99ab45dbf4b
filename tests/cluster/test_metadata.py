"""Topics, groups and settings in a real etcd: compare-and-swap creation, placement, refusals."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest

from halfmoon.broker.errors import IllegalGroup, IllegalTopic, TopicNotFound
from halfmoon.broker.groups import GroupConfig
from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.coordination.etcd_json import b64
from halfmoon.cluster.coordination.membership import Membership
from halfmoon.cluster.coordination.metadata import ClusterMetadata, encode
from halfmoon.cluster.coordination.placement import ClusterTopic
from halfmoon.cluster.errors import BadClusterName, CoordinatorConflict, NoLiveBrokers
from halfmoon.errors import InvalidArgument
from tests.cluster.etcd_server import EtcdServer

Scenario = Callable[[EtcdClient, ClusterMetadata, list[Membership]], Awaitable[None]]


def run(etcd: EtcdServer, cluster: str, brokers: list[str], scenario: Scenario) -> None:
    async def main() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            members = [
                Membership(client, cluster, "broker", b, f"127.0.0.1:{1000 + i}", ttl_s=10)
                for i, b in enumerate(brokers)
            ]
            for member in members:
                await member.start()
            try:
                await scenario(client, ClusterMetadata(client, cluster), members)
            finally:
                for member in members:
                    await member.stop()

    asyncio.run(main())


def test_two_proxies_creating_one_topic_at_once_agree(etcd: EtcdServer, cluster_name: str) -> None:
    async def scenario(client: EtcdClient, _: ClusterMetadata, __: list[Membership]) -> None:
        clients = [EtcdClient.from_url(etcd.url) for _ in range(4)]
        try:
            proxies = [ClusterMetadata(c, cluster_name) for c in clients]
            # Each asks for a different queue count: exactly one request wins, all see it.
            results = await asyncio.gather(
                *(p.create_topic("orders", queues=4 + i) for i, p in enumerate(proxies))
            )
        finally:
            for c in clients:
                await c.close()
        assert sum(created for _, created in results) == 1
        assert len({topic for topic, _ in results}) == 1
        winner = next(topic for topic, created in results if created)
        assert await ClusterMetadata(client, cluster_name).get_topic("orders") == winner

    run(etcd, cluster_name, ["a", "b"], scenario)


def test_queues_spread_over_all_live_brokers(etcd: EtcdServer, cluster_name: str) -> None:
    async def scenario(_: EtcdClient, meta: ClusterMetadata, __: list[Membership]) -> None:
        topic, created = await meta.create_topic("orders", queues=8)
        assert created
        assert sorted(Counter(q.broker for q in topic.queues).values()) == [2, 3, 3]
        assert topic.brokers == ["a", "b", "c"]
        again, created = await meta.create_topic("orders", queues=8)
        assert (again, created) == (topic, False)

    run(etcd, cluster_name, ["a", "b", "c"], scenario)


def test_a_broker_list_pins_the_queues(etcd: EtcdServer, cluster_name: str) -> None:
    async def scenario(_: EtcdClient, meta: ClusterMetadata, __: list[Membership]) -> None:
        topic, _ = await meta.create_topic("payments", queues=4, brokers=["c", "a"])
        assert [q.broker for q in topic.queues] == ["c", "a", "c", "a"]
        with pytest.raises(NoLiveBrokers, match="nope"):
            await meta.create_topic("refunds", queues=4, brokers=["a", "nope"])
        assert await meta.get_topic("refunds") is None

    run(etcd, cluster_name, ["a", "b", "c"], scenario)


def test_a_broker_joining_later_takes_queues_of_new_topics_only(
    etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario(client: EtcdClient, meta: ClusterMetadata, _: list[Membership]) -> None:
        early, _ = await meta.create_topic("early", queues=4)
        assert early.brokers == ["a"]
        late_broker = Membership(client, cluster_name, "broker", "b", "127.0.0.1:2000")
        await late_broker.start()
        try:
            late, _ = await meta.create_topic("late", queues=4)
            assert late.brokers == ["a", "b"]
            assert await meta.get_topic("early") == early  # existing topics do not move
        finally:
            await late_broker.stop()
        gone, _ = await meta.create_topic("after", queues=2)
        assert gone.brokers == ["a"]  # a stopped broker takes nothing new

    run(etcd, cluster_name, ["a"], scenario)


def test_no_live_broker_means_no_topic(etcd: EtcdServer, cluster_name: str) -> None:
    async def scenario(_: EtcdClient, meta: ClusterMetadata, __: list[Membership]) -> None:
        with pytest.raises(NoLiveBrokers):
            await meta.create_topic("orders")
        assert await meta.list_topics() == []

    run(etcd, cluster_name, [], scenario)


def test_bad_input_is_refused_and_stores_nothing(etcd: EtcdServer, cluster_name: str) -> None:
    async def scenario(_: EtcdClient, meta: ClusterMetadata, __: list[Membership]) -> None:
        for name in ["", "a/b", "%SYS", "x" * 200, "sp ace"]:
            with pytest.raises(IllegalTopic):
                await meta.create_topic(name)
        for kwargs in ({"queues": 0}, {"queues": 5000}, {"perm": "rwx"}, {"message_type": "x"}):
            with pytest.raises(InvalidArgument):
                await meta.create_topic("orders", **kwargs)  # type: ignore[arg-type]
        with pytest.raises(BadClusterName):
            await meta.create_topic("orders", brokers=["../a"])
        with pytest.raises(IllegalGroup):
            await meta.create_group(GroupConfig("a/b"))
        with pytest.raises(BadClusterName):
            await meta.set_setting("bad/key", 1)
        with pytest.raises(InvalidArgument):
            await meta.set_setting("key", {1, 2})
        with pytest.raises(TopicNotFound):
            await meta.set_topic_perm("missing", "r")
        assert await meta.list_topics() == [] and await meta.settings() == {}

    run(etcd, cluster_name, ["a"], scenario)
    with pytest.raises(BadClusterName):
        ClusterMetadata(None, "no/slashes")  # type: ignore[arg-type]


def test_a_change_from_a_stale_read_is_a_conflict(etcd: EtcdServer, cluster_name: str) -> None:
    def other_proxy_writes(key: str, value: dict) -> None:  # type: ignore[type-arg]
        """A second writer, synchronous so that it lands between update_topic's read and swap."""
        body = json.dumps({"key": b64(key), "value": b64(encode(value))}).encode()
        request = urllib.request.Request(f"http://{etcd.address}/v3/kv/put", data=body)
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200

    async def scenario(_: EtcdClient, meta: ClusterMetadata, __: list[Membership]) -> None:
        await meta.create_topic("orders", queues=2)

        def stale(topic: ClusterTopic) -> ClusterTopic:
            other_proxy_writes(meta.keys.topic("orders"), {**topic.to_json(), "perm": "r"})
            return ClusterTopic(topic.name, topic.queues, topic.message_type, "w", topic.created_ms)

        with pytest.raises(CoordinatorConflict) as caught:
            await meta.update_topic("orders", stale)
        assert caught.value.code == "COORDINATOR_CONFLICT"
        stored = await meta.get_topic("orders")
        assert stored is not None and stored.perm == "r"  # the other writer's change survives

    run(etcd, cluster_name, ["a"], scenario)


def test_groups_and_settings(etcd: EtcdServer, cluster_name: str) -> None:
    async def scenario(_: EtcdClient, meta: ClusterMetadata, __: list[Membership]) -> None:
        group, created = await meta.create_group(GroupConfig("billing", max_delivery_attempts=5))
        assert created and group.created_ms > 0
        again, created = await meta.create_group(GroupConfig("billing", max_delivery_attempts=9))
        assert not created and again.max_delivery_attempts == 5
        changed = await meta.update_group(
            "billing", lambda g: GroupConfig.from_dict({**g.to_dict(), "fifo": True})
        )
        assert changed.fifo and (await meta.get_group("billing")) == changed
        await meta.set_setting("transaction.check_interval_ms", 30000)
        await meta.set_setting("orderConf", {"orders": "a:4"})
        assert await meta.settings() == {
            "transaction.check_interval_ms": 30000,
            "orderConf": {"orders": "a:4"},
        }
        assert await meta.delete_setting("orderConf")
        assert await meta.get_setting("orderConf", "unset") == "unset"

    run(etcd, cluster_name, [], scenario)
