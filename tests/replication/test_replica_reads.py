"""Replica reads (``--replica-reads``, RocketMQ's slaveReadEnable) with real processes.

etcd, a sync group (a master and two replicas) and a proxy. With the setting
on, pulls and bulk reads through the proxy are answered by the in-sync
replicas (each replica's ``reads_served`` in its Status counts them) and
return exactly the acknowledged messages; a message the master wrote but the
group never acknowledged (one replica SIGSTOPped under
``min_insync_replicas=2``) is held by the other replica and never returned
by it. Pops never go to a replica: a simple consumer's receives and acks
through the proxy are the master's, and a replica refuses any operation but
pull and bulk read. With the setting off the replicas refuse every read
(``REPLICA_READ_REFUSED``) and the proxy reads from the master.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from halfmoon.broker.facade import PullResult
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.client import Message, SyncProducer
from halfmoon.cluster.internal import wire
from halfmoon.cluster.internal.replica_reads import READ
from halfmoon.spark.wire import Wire
from tests.cluster.broker_processes import BrokerProcess
from tests.replication.group_cluster import GroupCluster, receive_all, status
from tests.waiting import wait_until

TOPIC = "events"
READER = "replica-readers"


def wait_isr(group: GroupCluster, isr: list[str]) -> None:
    wait_until(lambda: status(group.master)["isr"] == isr, 20, f"in-sync set {isr}")


def stopped(broker: BrokerProcess) -> bool:
    """Whether every thread of the process is stopped (SIGSTOP delivered to all)."""
    tasks = Path(f"/proc/{broker.pid}/task")
    states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks.iterdir()]
    return all(state in ("T", "t") for state in states)


def proxy_reads(group: GroupCluster) -> dict[str, float]:
    """The proxy's ``halfmoon_replication_replica_reads_total`` by ``answered_by``."""
    assert group.proxy is not None
    url = f"http://127.0.0.1:{group.proxy.admin_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    found = re.findall(
        r'^halfmoon_replication_replica_reads_total\{[^}]*answered_by="(\w+)"[^}]*\} (\S+)$',
        text,
        re.MULTILINE,
    )
    return {who: float(value) for who, value in found}


def served(group: GroupCluster) -> list[int]:
    return [status(r)["reads_served"] for r in group.replicas]


def pulled(proxy: Wire, count: int = 1000) -> list[str]:
    """Every message id of the topic's one queue, read with pulls from offset 0."""
    (queue,) = proxy.queues(TOPIC)
    ids: list[str] = []
    offset = 0
    while True:
        answer = proxy.pull(READER, queue, offset, 32)
        if not answer.messages:
            return ids
        ids += [m.system_properties.message_id for m in answer.messages]
        offset = answer.next_offset
        if len(ids) >= count:
            return ids


def bulk_read(proxy: Wire) -> list[str]:
    (queue,) = proxy.queues(TOPIC)
    answer = proxy.bulk_read(READER, queue, 0, None, 1000, 1 << 20)
    return list(answer.columns.get("message_id", []))


def read_directly(replica: BrokerProcess) -> PullResult:
    """A pull asked of the replica's own read service, not through the proxy."""
    request = wire.encode(["pull", [READER, TOPIC, 0, 0, 1000, FilterSpec("TAG", "*")], 0])
    with grpc.insecure_channel(replica.address) as channel:
        answer = wire.decode(channel.unary_unary(READ)(request, timeout=5))
    assert isinstance(answer, PullResult)
    return answer


@pytest.fixture
def reads_group(tmp_path: Path) -> Iterator[GroupCluster]:
    group = GroupCluster(tmp_path / "group", min_insync=2, replica_reads=True).start()
    try:
        yield group
    finally:
        group.kill()


def test_replicas_serve_exactly_what_the_group_acknowledged(reads_group: GroupCluster) -> None:
    group = reads_group
    wait_isr(group, ["b1", "b2"])
    assert group.proxy is not None
    group.proxy.create_topic(TOPIC, "normal", queues=1)
    proxy = Wire(group.proxy.address)
    with SyncProducer(group.proxy.address) as producer:
        sent = [r.message_id for r in producer.send_batch(
            [Message(TOPIC, f"m-{i}".encode()) for i in range(20)]
        )]  # fmt: skip
    # Acknowledged under sync: both replicas hold them, and learn so from the master.
    assert wait_until(lambda: sorted(pulled(proxy)) == sorted(sent), 10, "the replicas' reads")
    assert sorted(bulk_read(proxy)) == sorted(sent)
    before = served(group)
    for _ in range(6):
        assert sorted(pulled(proxy)) == sorted(sent)
    after = served(group)
    # Spread over both in-sync replicas: each answered some of the reads.
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
    # The proxy counts them: every read of the group was answered by a replica so far.
    counts = proxy_reads(group)
    assert counts.get("replica", 0) >= sum(after) - sum(before) > 0
    assert counts.get("master", 0) == 0

    # A long-polled bulk read is answered soon after an acknowledged send, although the
    # master's arrival notice comes before the replicas hear the send was acknowledged.
    (queue,) = proxy.queues(TOPIC)
    answered: list[tuple[list[str], float]] = []

    def long_poll() -> None:
        answer = proxy.bulk_read(READER, queue, len(sent), None, 10, 1 << 20, wait=8)
        answered.append((list(answer.columns.get("message_id", [])), time.monotonic()))

    poller = threading.Thread(target=long_poll)
    poller.start()
    with SyncProducer(group.proxy.address) as producer:
        sent_at = time.monotonic()
        (late,) = producer.send_batch([Message(TOPIC, b"late")])
    poller.join(15)
    ((ids, at),) = answered
    assert ids == [late.message_id]
    print(f"long-polled read answered {at - sent_at:.3f}s after the send")
    assert at - sent_at < 2.0
    sent.append(late.message_id)

    # b2 paused: a send the master writes and b1 holds, but the group never acknowledges
    # (b2 is in the set until it lags 1.5 s; then the set is too small for min_insync 2).
    b1, b2 = group.replicas
    b2.pause()
    wait_until(lambda: stopped(b2), 10, "b2 to stop")  # every thread: no ack can leave it now
    try:
        with pytest.raises(Exception), SyncProducer(group.proxy.address) as producer:  # noqa: B017
            producer.send_batch([Message(TOPIC, b"never-acknowledged")])
        master_end = status(group.master)["end_offset"]
        wait_until(lambda: status(b1)["end_offset"] >= master_end, 10, "b1 to hold it")
        held = read_directly(b1)
        assert held.max_offset == len(sent), "the unacknowledged message is past the end"
        assert sorted(m.message_id for m in held.messages) == sorted(sent)
        assert status(b1)["committed_offset"] < status(b1)["end_offset"]
        wait_isr(group, ["b1"])
        # b1 alone in the set now holds it; b1 has heard the master's committed point since.
        wait_until(
            lambda: status(b1)["committed_offset"] == status(group.master)["committed_offset"],
            10,
            "b1 to know the master's committed point",
        )
        assert status(b1)["committed_offset"] < master_end
        served_b1 = status(b1)["reads_served"]
        assert sorted(pulled(proxy)) == sorted(sent)
        assert sorted(bulk_read(proxy)) == sorted(sent)
        assert status(b1)["reads_served"] >= served_b1 + 2, "b1 answered, not the master"
    finally:
        b2.resume()


def test_pops_are_never_served_by_a_replica(reads_group: GroupCluster) -> None:
    group = reads_group
    wait_isr(group, ["b1", "b2"])
    assert group.proxy is not None
    group.proxy.create_topic("orders", "normal", queues=2)
    group.proxy.create_group("readers")
    with SyncProducer(group.proxy.address) as producer:
        producer.send_batch([Message("orders", f"pop-{i}".encode()) for i in range(20)])
    before, counted = served(group), proxy_reads(group)
    # Receive (a pop) and ack every message through the proxy, with the official client.
    got = receive_all(group.proxy.address, at_least=20, timeout=60)
    assert sorted(got) == sorted(f"pop-{i}" for i in range(20))
    assert served(group) == before, "a replica answered a pop"
    assert proxy_reads(group) == counted  # no read of the group was sent to a replica
    # Asked directly, a replica serves pull and bulk_read only.
    request = wire.encode(["pop", [READER, "orders", 0, 32, 30_000], 0])
    with (
        grpc.insecure_channel(group.replicas[0].address) as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        channel.unary_unary(READ)(request, timeout=5)
    details = str(refused.value.details())  # type: ignore[attr-defined]
    assert "BAD_REQUEST" in details and "not 'pop'" in details, details


def test_with_the_setting_off_replicas_serve_nothing(tmp_path: Path) -> None:
    group = GroupCluster(tmp_path / "group", min_insync=1).start()
    try:
        wait_isr(group, ["b1", "b2"])
        assert group.proxy is not None
        group.proxy.create_topic(TOPIC, "normal", queues=1)
        proxy = Wire(group.proxy.address)
        with SyncProducer(group.proxy.address) as producer:
            sent = [r.message_id for r in producer.send_batch(
                [Message(TOPIC, f"m-{i}".encode()) for i in range(5)]
            )]  # fmt: skip
        for _ in range(4):
            assert sorted(pulled(proxy)) == sorted(sent)
            assert sorted(bulk_read(proxy)) == sorted(sent)
        assert served(group) == [0, 0]
        assert proxy_reads(group) == {}  # no group with replica reads: none counted
        with pytest.raises(grpc.RpcError) as refused:
            read_directly(group.replicas[0])
        assert "REPLICA_READ_REFUSED" in str(refused.value.details())  # type: ignore[attr-defined]
    finally:
        group.kill()
