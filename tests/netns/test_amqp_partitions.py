"""AMQP consumers of a proxy cut off from etcd past its lease, on a real (virtual) network.

Two proxies, each on a host of its own; the test process holds pika connections to both.
Cut off from etcd longer than its lease (2 s), a proxy is taken for dead by the cluster: its
consumers no longer count on the other proxy, and an exclusive consumer may start there on a
queue the cut-off proxy consumed from. Healed, the proxy records its consumers again under a
new lease, and cancels (a server-sent Basic.Cancel) the one the cluster no longer lets in.
The queues are durable: a transient queue lives under its proxy's lease and goes with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.cluster.cluster_server import wait_until
from tests.cluster.test_cluster_amqp import connect
from tests.cluster.test_cluster_amqp_consumers import consumers, ignore
from tests.netns.cluster import LEASE_TTL_S, NetCluster
from tests.netns.network import VirtualNetwork
from tests.netns.processes import NetProxy

DEADLINE_S = 30.0


@pytest.fixture
def two_proxies(network: VirtualNetwork, tmp_path: Path) -> Iterator[tuple[NetCluster, NetProxy]]:
    cluster = NetCluster(network, tmp_path)
    second = NetProxy(network.add_host("proxy2"), tmp_path / "proxy2", cluster.etcd.url, "net")
    try:
        cluster.start()
        second.start()
        yield cluster, second
    finally:
        second.kill()
        cluster.kill()


def test_a_proxy_cut_off_from_etcd_past_its_lease_is_taken_for_dead_then_records_again(
    network: VirtualNetwork, two_proxies: tuple[NetCluster, NetProxy]
) -> None:
    cluster, other = two_proxies
    cut = connect(cluster.proxy)
    survivor = connect(other)
    try:
        shared = cut.channel()
        shared.queue_declare("kept", durable=True)
        shared.basic_consume("kept", ignore)
        exclusive = cut.channel()
        exclusive.queue_declare("taken", durable=True)
        cancelled: list[str] = []
        exclusive.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        tag = exclusive.basic_consume("taken", ignore, exclusive=True)
        assert consumers(other, "kept") == 1
        assert consumers(other, "taken") == 1

        network.isolate(cluster.proxy_host, *cluster.etcd_hosts)
        wait_until(
            lambda: consumers(other, "kept") == 0,
            LEASE_TTL_S + DEADLINE_S,
            "the cut-off proxy's consumers to end with its lease",
        )
        taker = survivor.channel()
        taker.basic_consume("taken", ignore, exclusive=True)  # the queue is free in the cluster
        assert not cancelled  # the cut-off proxy has not heard of it yet

        network.heal()
        wait_until(
            lambda: consumers(other, "kept") == 1,
            DEADLINE_S,
            "the healed proxy to record its consumer again",
        )

        def told() -> bool:
            cut.process_data_events(time_limit=0)
            return cancelled == [tag]

        wait_until(told, DEADLINE_S, "the healed proxy to cancel the exclusive consumer it lost")
        assert consumers(other, "taken") == 1  # the survivor's alone
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as error:
            cut.channel().basic_consume("taken", ignore)
        assert error.value.reply_code == 403  # still held by the survivor's exclusive consumer
    finally:
        for connection in (cut, survivor):
            if connection.is_open:
                connection.close()
