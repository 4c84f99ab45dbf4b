"""The etcd TopologyStore on a real etcd, two stores standing for two proxies: what one saves
the other hears (watch) or reads (catch-up); of two different declares of one name at once
the second is 406 and both end with the first; a store's own write is never undone by an
older event; transient entities go with the store's lease."""

from __future__ import annotations

import asyncio

from halfmoon.amqp.reply_codes import AmqpChannelError
from halfmoon.amqp.topology import Exchange, Topology
from halfmoon.cluster.coordination.amqp_topology import EtcdTopologyStore
from halfmoon.cluster.coordination.etcd import EtcdClient
from tests.cluster.etcd_server import EtcdServer
from tests.waiting import until

DEADLINE_S = 30.0


def _declare_queue(topology: Topology, name: str, durable: bool = True) -> None:
    topology.vhost("/", "").declare_queue(
        name, "conn-1", passive=False, durable=durable, exclusive=False, auto_delete=False,
        arguments={"x-max-length": 3},
    )  # fmt: skip


def test_two_stores_see_each_others_topology(etcd: EtcdServer, cluster_name: str) -> None:
    async def scenario() -> None:
        async with (
            EtcdClient.from_url(etcd.url) as client_a,
            EtcdClient.from_url(etcd.url) as client_b,
        ):
            a = Topology(EtcdTopologyStore(client_a, cluster_name, 2))
            b = Topology(EtcdTopologyStore(client_b, cluster_name, 2))
            await a.open()
            await b.open()
            try:
                vhost_a = a.vhost("/", "")
                vhost_a.declare_exchange(Exchange("ex", "topic"), passive=False)
                _declare_queue(a, "q")
                vhost_a.bind("ex", "q", False, "k.*", {}, "conn-1")
                await a.save()

                # Read through at once, without waiting for the watch.
                vhost_b = b.vhost("/", "")
                await b.catch_up(vhost_b)
                assert [q.name for q in vhost_b.route("ex", "k.x", {})] == ["q"]
                assert vhost_b.queues["q"].arguments == {"x-max-length": 3}
                queue_object = vhost_b.queues["q"]

                # A removal through A reaches B by the watch; the queue object B's consumers
                # would hold is the one removed.
                gone = []
                b.on_queue_gone = lambda vhost, queue: gone.append(queue)
                vhost_a.bind("ex", "q", False, "k.*", {}, "conn-1", unbind=True)
                await a.save()
                await until(
                    lambda: not vhost_b.route("ex", "k.x", {}), DEADLINE_S, "the unbind on B"
                )
                vhost_a.remove_queue("q")
                await a.save()
                await until(lambda: gone == [queue_object], DEADLINE_S, "the queue's removal on B")

                # Declared differently through both at once: whichever create reaches etcd
                # second is 406, and both end with the first one's definition.
                vhost_a.declare_exchange(Exchange("race", "direct"), passive=False)
                vhost_b.declare_exchange(Exchange("race", "fanout"), passive=False)
                outcomes = await asyncio.gather(a.save(), b.save(), return_exceptions=True)
                refused = [o for o in outcomes if isinstance(o, AmqpChannelError)]
                assert len(refused) == 1 and refused[0].code == 406, outcomes
                assert outcomes.count(None) == 1, outcomes
                await until(
                    lambda: vhost_a.exchanges["race"].same(vhost_b.exchanges["race"]),
                    DEADLINE_S,
                    "both to hold the definition that was stored",
                )
            finally:
                await a.close()
                await b.close()

            # A's transient queue went with A's lease; its durable exchange stayed.
            c = Topology(EtcdTopologyStore(client_b, cluster_name, 2))
            await c.open()
            try:
                assert "race" in c.vhost("/", "").exchanges
                assert "ex" in c.vhost("/", "").exchanges
            finally:
                await c.close()

    asyncio.run(scenario())


def test_transient_entities_end_with_their_store(etcd: EtcdServer, cluster_name: str) -> None:
    async def scenario() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            a = Topology(EtcdTopologyStore(client, cluster_name, 2))
            await a.open()
            _declare_queue(a, "lasting")
            _declare_queue(a, "passing", durable=False)
            a.vhost("/", "").bind("amq.direct", "passing", False, "p", {}, "conn-1")
            a.vhost("/", "").bind("amq.direct", "lasting", False, "l", {}, "conn-1")
            await a.save()
            await a.close()  # revokes the lease

            again = Topology(EtcdTopologyStore(client, cluster_name, 2))
            await again.open()
            try:
                vhost = again.vhost("/", "")
                assert set(vhost.queues) == {"lasting"}
                assert [q.name for q in vhost.route("amq.direct", "l", {})] == ["lasting"]
                assert vhost.route("amq.direct", "p", {}) == []
            finally:
                await again.close()

    asyncio.run(scenario())


def test_with_etcd_away_a_catch_up_keeps_what_was_heard(
    own_etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario() -> None:
        async with EtcdClient.from_url(own_etcd.url, timeout=2) as client:
            topology = Topology(EtcdTopologyStore(client, cluster_name, 2))
            await topology.open()
            vhost = topology.vhost("/", "")
            _declare_queue(topology, "kept")
            vhost.bind("amq.direct", "kept", False, "k", {}, "conn-1")
            await topology.save()
            own_etcd.stop()
            try:
                assert await topology.catch_up(vhost) is False
                assert [q.name for q in vhost.route("amq.direct", "k", {})] == ["kept"]
            finally:
                await topology.close()  # the lease cannot be revoked: logged, not raised

    asyncio.run(scenario())
