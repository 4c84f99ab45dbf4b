"""Epoch fencing of a proxy's writes to a broker group, with real processes (fencing.py).

A proxy reaches a group's master for the epoch the group's routing entry names,
and every request it sends carries that epoch: a ``Call`` in its metadata, a
send (over the send listener) in its connection's hello. A member refuses, before storing
anything, a request meant for an older epoch than its own (``EPOCH_STALE``: the
proxy has not seen the failover yet) and one meant for a newer epoch
(``MASTER_DEPOSED``: another master was appointed and this one has not noticed).

The requests here are sent straight to a member (``RemoteBroker`` with the
epoch given), as a proxy with that view of the group would send them; what
the member's own consume queues hold shows that nothing of them was stored.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from rocketmq import Producer

from halfmoon.broker import OutgoingMessage
from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.coordination.keys import ClusterKeys
from halfmoon.cluster.errors import EpochStale, MasterDeposed
from halfmoon.cluster.internal.remote_broker import RemoteBroker
from halfmoon.errors import HalfmoonError
from halfmoon.replication.keys import GroupKeys
from tests.cluster.broker_processes import BrokerProcess
from tests.replication.group_cluster import (
    CLUSTER,
    GROUP,
    GroupCluster,
    acting_master,
    held,
    running,
    status,
)
from tests.replication.test_group_replication import client_sends, message, producer
from tests.waiting import wait_until


@pytest.fixture
def group(tmp_path: Path) -> Iterator[GroupCluster]:
    # Async replication: a master acknowledges a write after its own flush, so without the
    # fence the writes below would be stored and acknowledged.
    cluster = GroupCluster(tmp_path / "group", mode="async", min_insync=0, replicas=1)
    with running(cluster) as started:
        yield started


@pytest.fixture
def long_lease_group(tmp_path: Path) -> Iterator[GroupCluster]:
    """Leases that outlive the test: the old master keeps its lease, and so does not notice
    that etcd names another master (a master paused or cut off, not yet deposed)."""
    cluster = GroupCluster(
        tmp_path / "group", mode="async", min_insync=0, replicas=1, lease_ttl_s=20
    )
    with running(cluster) as started:
        yield started


def outgoing(body: str) -> list[OutgoingMessage]:
    return [OutgoingMessage("orders", body.encode(), message_id=body)]


def refusals(member: BrokerProcess, epoch: int) -> list[HalfmoonError]:
    """A write of each kind meant for ``epoch``, sent straight to ``member``: a blocking send
    and one from an event loop (both over the send listener, from the remote's send loop and
    from the caller's), and a ``Call`` that changes state. The error each was refused with (a
    write accepted fails the test)."""
    found: list[HalfmoonError] = []

    def refused(write: object) -> None:
        try:
            if asyncio.iscoroutine(write):
                asyncio.run(write)
            else:
                assert callable(write)
                write()
        except HalfmoonError as error:
            found.append(error)
            return
        raise AssertionError(f"a write meant for epoch {epoch} was accepted by {member.name}")

    remote = RemoteBroker(member.address, epoch=epoch)
    try:
        refused(lambda: remote.send(outgoing(f"blocking-{epoch}")))
        refused(remote.send_async(outgoing(f"listener-{epoch}")))
        refused(lambda: remote.create_topic(f"made-in-epoch-{epoch}", queue_count=1))
    finally:
        remote.close()
    return found


def test_a_write_meant_for_the_epoch_before_a_failover_is_refused_by_the_new_master(
    group: GroupCluster,
) -> None:
    wait_until(lambda: status(group.master)["isr"] == ["b1"], 15, "the replica in sync")
    assert group.proxy is not None
    group.proxy.create_topic("orders", "normal", queues=1)
    client = producer(group, "orders")
    try:
        client.send(message("orders", 0))
        group.master.kill()
        new_master = wait_until(lambda: acting_master(group), 20, "the replica to take office")
        # The official client, through the proxy, reaches the new master (epoch 2).
        wait_until(lambda: client_sends(client, 1), 30, "a send through the proxy")
    finally:
        client.shutdown()
    assert status(new_master)["epoch"] == 2
    before = held(new_master, "orders", 1)

    errors = refusals(new_master, epoch=1)
    assert [type(e) for e in errors] == [EpochStale] * 3, errors
    assert all(e.code == "EPOCH_STALE" and e.protocol_code == "HA_NOT_AVAILABLE" for e in errors)
    assert held(new_master, "orders", 1) == before  # nothing of them was stored

    current = RemoteBroker(new_master.address, epoch=2)
    try:
        assert current.find_topic("made-in-epoch-1") is None
        current.send(outgoing("current"))  # the same write for the master's own epoch
    finally:
        current.close()
    assert held(new_master, "orders", 1) == before + 1


def test_a_master_another_was_appointed_over_refuses_writes_meant_for_the_new_epoch(
    long_lease_group: GroupCluster,
) -> None:
    group = long_lease_group
    wait_until(lambda: status(group.master)["isr"] == ["b1"], 15, "the replica in sync")
    assert group.proxy is not None
    group.proxy.create_topic("orders", "normal", queues=1)
    client = producer(group, "orders")
    try:
        client.send(message("orders", 0))
    finally:
        client.shutdown()
    old_master, replica = group.master, group.replicas[0]

    async def appoint() -> None:  # what a controller writes: a new master in a newer epoch
        async with EtcdClient.from_url(group.etcd.url) as etcd:
            record = {"member": replica.name, "endpoint": replica.address, "epoch": 2}
            await etcd.put(GroupKeys(CLUSTER, GROUP).master, json.dumps(record).encode())

    asyncio.run(appoint())
    # Its lease alive, the old master has not noticed: it still takes itself for the master.
    assert (status(old_master)["role"], status(old_master)["epoch"]) == ("master", 1)
    before = held(old_master, "orders", 1)

    errors = refusals(old_master, epoch=2)
    assert [type(e) for e in errors] == [MasterDeposed] * 3, errors
    assert all(e.code == "MASTER_DEPOSED" and e.protocol_code == "HA_NOT_AVAILABLE" for e in errors)
    assert held(old_master, "orders", 1) == before  # it acknowledged and stored none of them


def test_a_proxy_tags_its_writes_with_the_epoch_the_groups_routing_entry_names(
    long_lease_group: GroupCluster,
) -> None:
    """The official client through the proxy: once the group's routing entry names an epoch
    the master does not have, the master refuses what the proxy sends it (the proxy carries
    the epoch from etcd); named again with the master's own, sends go through."""
    group = long_lease_group
    wait_until(lambda: status(group.master)["isr"] == ["b1"], 15, "the replica in sync")
    assert group.proxy is not None
    group.proxy.create_topic("orders", "normal", queues=1)
    key = ClusterKeys(CLUSTER).broker(GROUP)

    async def route(epoch: int) -> None:
        async with EtcdClient.from_url(group.etcd.url) as etcd:
            entry = await etcd.get(key)
            assert entry is not None
            record = json.loads(entry.value)
            await etcd.put(key, json.dumps({**record, "epoch": epoch}).encode())

    client = producer(group, "orders")
    try:
        client.send(message("orders", 0))
        asyncio.run(route(2))
        # The proxy reconnects for epoch 2 once its view shows the entry (meanwhile the group
        # is unreachable for a moment); from then on the master, in epoch 1, refuses every
        # send, and stores none.
        wait_until(lambda: deposed(send_error(client, 1)), 30, "a send refused as deposed")
        before = held(group.master, "orders", 1)
        for i in range(2, 4):
            assert deposed(send_error(client, i))
        assert held(group.master, "orders", 1) == before
        asyncio.run(route(1))
        wait_until(lambda: client_sends(client, 4), 30, "a send through the proxy")
    finally:
        client.shutdown()
    assert held(group.master, "orders", 1) == before + 1


def deposed(error: str) -> bool:
    """A refusal as ``MASTER_DEPOSED``, as the client sees it: HA_NOT_AVAILABLE (50002)."""
    return "50002" in error and "is no longer the master of group" in error


def send_error(client: Producer, i: int) -> str:
    """What the official client's send of message ``i`` failed with ("" when it was sent)."""
    try:
        client.send(message("orders", i))
    except Exception as error:  # noqa: BLE001 - the client's exceptions have no common base
        return f"{type(error).__name__}: {error}"
    return ""
