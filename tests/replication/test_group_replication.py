"""A broker group of real processes: a master and two replicas behind a proxy, etcd deciding.

The official RocketMQ Python client sends through the proxy. Under sync
replication a send is acknowledged only once both replicas hold it; a replica
SIGKILLed leaves the in-sync set, and with ``min_insync_replicas=2`` the
master then refuses sends (and pop acks) with NOT_ENOUGH_REPLICAS; restarted, the replica
catches up from its own log's end and rejoins. Under async replication a
paused replica does not hold sends up. Every replica's commit log is byte for
byte the master's.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import Code

from halfmoon.broker.offset_journal import OffsetJournal
from halfmoon.broker.offsets import OffsetTable
from halfmoon.broker.topics import OFFSETS_TOPIC
from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.replication.keys import GroupKeys
from halfmoon.store import MessageStore, StoreConfig
from tests.replication.group_cluster import (
    CLUSTER,
    GROUP,
    GroupCluster,
    held,
    status,
)
from tests.waiting import wait_until


@pytest.fixture
def sync_group(tmp_path: Path) -> Iterator[GroupCluster]:
    group = GroupCluster(tmp_path / "group", mode="sync", min_insync=2).start()
    try:
        yield group
    finally:
        group.kill()


@pytest.fixture
def async_group(tmp_path: Path) -> Iterator[GroupCluster]:
    group = GroupCluster(tmp_path / "group", mode="async", min_insync=1, replicas=1).start()
    try:
        yield group
    finally:
        group.kill()


def producer(group: GroupCluster, topic: str) -> Producer:
    assert group.proxy is not None
    config = ClientConfiguration(group.proxy.address, Credentials(), request_timeout=5)
    client = Producer(config, (topic,))
    client.startup()
    return client


def message(topic: str, i: int) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = f"body-{i}".encode()
    msg.keys = f"key-{i}"
    return msg


def isr_in_etcd(group: GroupCluster) -> list[str]:
    async def read() -> list[str]:
        async with EtcdClient.from_url(group.etcd.url) as client:
            found = await client.get(GroupKeys(CLUSTER, GROUP).isr)
            return list(json.loads(found.value)["isr"]) if found else []

    return asyncio.run(read())


def wait_isr(group: GroupCluster, expected: list[str], timeout: float = 15.0) -> None:
    wait_until(lambda: status(group.master)["isr"] == expected, timeout, f"the ISR {expected}")
    assert isr_in_etcd(group) == expected  # published before it is used


def log_bytes(data_dir: Path, end: int) -> bytes:
    data = b"".join(p.read_bytes() for p in sorted((data_dir / "commitlog").iterdir()))
    return data[:end]


def test_sync_sends_are_acknowledged_once_both_replicas_hold_them(
    sync_group: GroupCluster,
) -> None:
    group = sync_group
    assert status(group.master)["role"] == "master"
    assert [status(r)["role"] for r in group.replicas] == ["replica", "replica"]
    wait_isr(group, ["b1", "b2"])
    assert group.proxy is not None
    group.proxy.create_topic("orders", "normal", queues=2)
    client = producer(group, "orders")
    try:
        for i in range(20):
            client.send(message("orders", i))
            # Acknowledged: both replicas' own consume queues already hold it.
            assert [held(r, "orders", 2) for r in group.replicas] == [i + 1, i + 1]
    finally:
        client.shutdown()
    # An offset commit (a reset to the queues' ends) is journaled in the log: the replicas
    # hold it once it is acknowledged.
    code, _ = group.proxy.admin_call("POST", "/v1/groups", {"name": "billing"})
    assert code in (200, 201)
    code, answer = group.proxy.admin_call(
        "POST", "/v1/groups/billing/reset-offset",
        {"topic": "orders", "timestamp_ms": int(time.time() * 1000) + 3_600_000},
    )  # fmt: skip
    assert code == 200, answer
    committed = {q["queue_id"]: q["offset"] for q in answer["queues"]}  # type: ignore[index]
    assert sum(committed.values()) == 20
    journaled = [held(r, OFFSETS_TOPIC, 1) for r in group.replicas]
    assert journaled[0] == journaled[1] >= 2  # both queues' commits, on both replicas
    # The master also writes records nobody waits for (message traces): compare what both
    # replicas have, all of it acknowledged or not, with the master's bytes.
    end = min(status(r)["end_offset"] for r in group.replicas)
    group.stop()
    master_log = log_bytes(group.master.data_dir, end)
    for replica in group.replicas:
        assert log_bytes(replica.data_dir, end) == master_log
        config = StoreConfig(data_dir=replica.data_dir, segment_size=1024 * 1024)
        with MessageStore(config) as store:  # the replica's own consume queues and key index
            assert sum(store.max_offset("orders", q) for q in range(2)) == 20
            found = store.query_by_key("orders", "key-7")
            assert [m.body for m in found] == [b"body-7"]
            offsets = OffsetTable(replica.data_dir / "elsewhere", journal=OffsetJournal(store))
            assert {q: offsets.get("billing", "orders", q) for q in range(2)} == committed
    epochs = (group.replicas[0].data_dir / "replication" / "epochs").read_text()
    assert epochs == "1 0\n"


def cluster_list(group: GroupCluster, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "halfmoon", "cluster", "list",
         "--coordinator", group.etcd.url, "--cluster", CLUSTER, *extra],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_killed_replica_leaves_the_isr_and_sync_sends_are_refused_until_it_is_back(
    sync_group: GroupCluster,
) -> None:
    group = sync_group
    wait_isr(group, ["b1", "b2"])
    (listed,) = json.loads(cluster_list(group, "--json"))["broker_groups"]
    assert listed.pop("master_endpoint") == group.master.address
    replicas = listed.pop("replicas")  # as the master sees them (its replication Status)
    assert sorted(replicas) == ["b1", "b2"]
    assert all(r["in_sync"] and r["connected"] for r in replicas.values()), replicas
    assert (listed.pop("failovers"), listed.pop("switchovers")) == (0, 0)
    assert listed == {
        "group": GROUP, "master": "b0", "epoch": 1, "isr": ["b1", "b2"],
        "members": ["b0", "b1", "b2"], "mode": "sync", "min_insync_replicas": 2,
    }  # fmt: skip
    assert re.search(
        r"^g1\s+b0\s+1\s+sync\s+b1,b2\s+b0,b1,b2\s+b1 [\d.]+ \w+/\d+ms, b2 [\d.]+ \w+/\d+ms$",
        cluster_list(group),
        re.M,
    )
    assert group.proxy is not None
    group.proxy.create_topic("orders", "normal", queues=2)
    client = producer(group, "orders")
    try:
        for i in range(5):
            client.send(message("orders", i))
        group.replicas[1].kill()
        wait_isr(group, ["b1"])
        wait_until(
            lambda: (
                json.loads(cluster_list(group, "--json"))["broker_groups"][0]["members"]
                == ["b0", "b1"]
            ),
            10,
            "the killed member's lease to expire",
        )
        with pytest.raises(Exception) as refused:
            client.send(message("orders", 100))
        # Refused before any write: its topic's queues did not grow. (The log's end is no
        # measure: the broker's own journal records, such as the delay timer's progress, keep
        # being appended meanwhile.) A queue counts what is flushed, so wait until the master
        # made visible everything written by now: a refused send written would be counted.
        written = status(group.master)["end_offset"]
        wait_until(
            lambda: status(group.master)["visible_offset"] >= written, 10, "the master's flush"
        )
        assert held(group.master, "orders", 2) == 5
        # NOT_ENOUGH_REPLICAS reaches a RocketMQ client as HA_NOT_AVAILABLE (50002).
        assert str(refused.value).startswith(f"{Code.HA_NOT_AVAILABLE}, "), refused.value
        assert "fewer than min_insync_replicas=2" in str(refused.value)
        assert status(group.master)["isr"] == ["b1"]
        # Back on its own data directory: it fetches from its log's end and rejoins.
        group.replicas[1].start()
        wait_isr(group, ["b1", "b2"])
        client.send(message("orders", 5))
        # 0-4 and 5: the refused one never written (a written one would precede 5 in the log,
        # so both would hold it once 5 is acknowledged).
        assert held(group.master, "orders", 2) == 6
        assert held(group.replicas[1], "orders", 2) == 6
    finally:
        client.shutdown()
    end = status(group.replicas[1])["end_offset"]
    group.stop()
    assert log_bytes(group.replicas[1].data_dir, end) == log_bytes(group.master.data_dir, end)


def test_async_sends_do_not_wait_for_a_paused_replica(async_group: GroupCluster) -> None:
    group = async_group
    wait_isr(group, ["b1"])
    assert group.proxy is not None
    group.proxy.create_topic("orders", "normal", queues=1)
    client = producer(group, "orders")
    replica = group.replicas[0]
    try:
        client.send(message("orders", 0))
        wait_until(
            lambda: status(replica)["visible_offset"] >= status(group.master)["end_offset"],
            10,
            "the replica to catch up",
        )
        replica.pause()
        try:
            started = time.monotonic()
            for i in range(1, 11):
                client.send(message("orders", i))
            assert time.monotonic() - started < 5  # no replica round trip held them
            master = status(group.master)
            master_end = master["end_offset"]
            assert master["replicas"]["b1"]["acked"] < master_end  # it does not have them
        finally:
            replica.resume()
        wait_until(
            lambda: status(replica)["visible_offset"] >= master_end, 10, "the replica to catch up"
        )
    finally:
        client.shutdown()


@pytest.fixture
def long_lease_group(tmp_path: Path) -> Iterator[GroupCluster]:
    """A sync group whose members' leases outlive a broker's restart (a busy machine restarts
    a broker in several seconds, past the other groups' 2 s)."""
    group = GroupCluster(tmp_path / "group", mode="sync", min_insync=2, lease_ttl_s=20).start()
    try:
        yield group
    finally:
        group.kill()


def test_a_restarted_master_takes_office_again_in_a_new_epoch_and_replicas_follow(
    long_lease_group: GroupCluster,
) -> None:
    # Restarted within its lease, the master finds the key naming itself and takes it over
    # (coordination.py); with a lease shorter than the restart, a controller would appoint
    # a replica instead (test_failover.py).
    group = long_lease_group
    wait_isr(group, ["b1", "b2"])
    assert group.proxy is not None
    group.proxy.create_topic("orders", "normal", queues=1)
    client = producer(group, "orders")
    try:
        for i in range(3):
            client.send(message("orders", i))
        end_of_epoch_1 = status(group.master)["end_offset"]
        group.master.kill()
        group.master.start()  # the same member, data directory and port
        assert status(group.master)["epoch"] == 2
        epochs = status(group.master)["epochs"]
        assert epochs[0] == [1, 0] and epochs[1][0] == 2 and epochs[1][1] >= end_of_epoch_1
        wait_isr(group, ["b1", "b2"])
        wait_until(lambda: client_sends(client, 3), 30, "a send through the proxy")
    finally:
        client.shutdown()
    for member in group.brokers:
        assert status(member)["epoch"] == 2
    end = min(status(r)["end_offset"] for r in group.replicas)
    group.stop()
    for member in group.brokers:
        table = (member.data_dir / "replication" / "epochs").read_text()
        assert table == f"1 0\n2 {epochs[1][1]}\n", member.name
        assert log_bytes(member.data_dir, end) == log_bytes(group.master.data_dir, end)


def client_sends(client: Producer, i: int) -> bool:
    try:
        client.send(message("orders", i))
    except Exception:  # noqa: BLE001 - the proxy is reconnecting to the restarted master
        return False
    return True


def test_replicas_leave_a_master_etcd_no_longer_names_and_it_cannot_change_the_isr(
    sync_group: GroupCluster,
) -> None:
    group = sync_group
    wait_isr(group, ["b1", "b2"])
    new_master = group.replicas[1]

    async def appoint() -> None:  # what a controller will do: a new master in a newer epoch
        async with EtcdClient.from_url(group.etcd.url) as client:
            record = {"member": "b2", "endpoint": new_master.address, "epoch": 2}
            await client.put(GroupKeys(CLUSTER, GROUP).master, json.dumps(record).encode())

    asyncio.run(appoint())
    follower = group.replicas[0]
    wait_until(
        lambda: (s := status(follower))["master"] == "b2" and s["epoch"] == 2,
        10,
        "the replica to follow the appointed master",
    )
    wait_until(
        lambda: all(r["streams"] == 0 for r in status(group.master)["replicas"].values()),
        10,
        "both replicas to leave the old master",
    )
    # The old master sees its replicas gone (past --replica-max-lag-ms) but can no longer
    # publish a smaller set: the compare on the master key it wrote fails. Its ISR, and
    # etcd's, stay as they were.
    wait_until(
        lambda: any("event=isr_publish_refused" in line for line in group.master.output),
        15,
        "the old master's attempt to shrink the in-sync set, refused",
    )
    assert status(group.master)["isr"] == ["b1", "b2"]
    assert isr_in_etcd(group) == ["b1", "b2"]


class CommitChecker(TransactionChecker):
    def check(self, message: Message) -> TransactionResolution:
        return TransactionResolution.COMMIT


def test_a_transaction_decision_is_acknowledged_once_both_replicas_hold_it(
    sync_group: GroupCluster,
) -> None:
    group = sync_group
    wait_isr(group, ["b1", "b2"])
    assert group.proxy is not None
    group.proxy.create_topic("payments", "transaction", queues=1)
    config = ClientConfiguration(group.proxy.address, Credentials(), request_timeout=5)
    client = Producer(config, ("payments",), checker=CommitChecker())
    client.startup()
    try:
        transaction = client.begin_transaction()
        client.send(message("payments", 1), transaction)
        assert [held(r, "payments", 1) for r in group.replicas] == [0, 0]  # a half only
        transaction.commit()
        # The decision (the committed message) is on both replicas.
        assert [held(r, "payments", 1) for r in group.replicas] == [1, 1]
    finally:
        client.shutdown()
    group.stop()
    for replica in group.replicas:
        config = StoreConfig(data_dir=replica.data_dir, segment_size=1024 * 1024)
        with MessageStore(config) as store:
            committed = store.get("payments", 0, 0).messages
            assert [m.body for m in committed] == [b"body-1"]


def test_a_pop_ack_is_refused_with_too_few_replicas_in_sync(sync_group: GroupCluster) -> None:
    """An ack answers once its %HM_POP% record is on the in-sync replicas: with fewer than
    min_insync_replicas in sync it fails as a send does (HA_NOT_AVAILABLE)."""
    group = sync_group
    wait_isr(group, ["b1", "b2"])
    assert group.proxy is not None
    group.proxy.create_topic("orders", "normal", queues=1)
    group.proxy.create_group("workers", consume_from="earliest")
    client = producer(group, "orders")
    config = ClientConfiguration(group.proxy.address, Credentials(), request_timeout=10)
    reader = SimpleConsumer(config, "workers", {"orders": FilterExpression()}, await_duration=1)
    reader.startup()
    try:
        for i in range(2):
            client.send(message("orders", i))
        got: list[Message] = []
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            got += reader.receive(2 - len(got), 60)
        assert len(got) == 2
        reader.ack(got[0])  # both replicas in sync: acknowledged
        group.replicas[1].kill()
        wait_isr(group, ["b1"])
        with pytest.raises(Exception) as refused:
            reader.ack(got[1])
        assert str(refused.value).startswith(f"{Code.HA_NOT_AVAILABLE}, "), refused.value
        assert "fewer than min_insync_replicas=2" in str(refused.value)
    finally:
        reader.shutdown()
        client.shutdown()
