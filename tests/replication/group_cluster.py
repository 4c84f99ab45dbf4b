"""A real broker group for tests: etcd, a master and replicas, and a proxy, each a process.

The first broker started wins the group's key in etcd and is its master; the
others start after it and are replicas. :func:`status` asks any member for
its replication ``Status`` over the replication service.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

from halfmoon.replication import protocol
from tests.cluster.broker_processes import BrokerProcess
from tests.cluster.cluster_server import ClusterProxy
from tests.cluster.etcd_server import EtcdServer

CLUSTER = "repl"
GROUP = "g1"


class GroupCluster:
    def __init__(
        self,
        root: Path,
        *,
        replicas: int = 2,
        mode: str = "sync",
        min_insync: int = 2,
        max_lag_ms: int = 1500,
        flush: str = "sync",
        replica_reads: bool = False,
        lease_ttl_s: int | None = None,  # None: the brokers' default
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.etcd = EtcdServer(root / "etcd")
        self.flags = (
            "--cluster", CLUSTER,
            "--coordinator", "",  # filled once etcd has its port
            *(("--lease-ttl", str(lease_ttl_s)) if lease_ttl_s is not None else ()),
            "--group", GROUP,
            "--replication", mode,
            "--min-insync-replicas", str(min_insync),
            "--replica-max-lag-ms", str(max_lag_ms),
            "--set", "store.segment_size=1048576",
            *(("--replica-reads",) if replica_reads else ()),
        )  # fmt: skip
        self.flush = flush
        self.brokers = [BrokerProcess(root / f"b{i}", name=f"b{i}") for i in range(replicas + 1)]
        self.proxy: ClusterProxy | None = None

    def start(self) -> GroupCluster:
        self.etcd.start()
        flags = list(self.flags)
        flags[flags.index("--coordinator") + 1] = self.etcd.url
        for broker in self.brokers:
            broker.extra = tuple(flags)
            broker.start()  # in order: the first is the master
        self.proxy = ClusterProxy(self.root / "proxy", self.etcd, CLUSTER).start()  # type: ignore[assignment]
        return self

    @property
    def master(self) -> BrokerProcess:
        return self.brokers[0]

    @property
    def replicas(self) -> list[BrokerProcess]:
        return self.brokers[1:]

    def stop(self) -> None:
        if self.proxy is not None and self.proxy.alive():
            self.proxy.stop()
        for broker in reversed(self.brokers):
            if broker.process is not None and broker.process.poll() is None:
                broker.stop()
        self.etcd.stop()

    def kill(self) -> None:
        if self.proxy is not None:
            self.proxy.kill()
        for broker in self.brokers:
            broker.kill()
        self.etcd.stop()


def status(
    broker: BrokerProcess,
    queues: Sequence[tuple[str, int]] = (),
    timeout: float = 5.0,
) -> dict[str, Any]:
    with grpc.insecure_channel(broker.address) as channel:
        call = channel.unary_unary(protocol.STATUS)
        request = {"queues": [list(q) for q in queues]}
        return protocol.decode(call(protocol.encode(request), timeout=timeout))


def role(broker: BrokerProcess, timeout: float = 5.0) -> str | None:
    """The member's role; None while it does not answer (being promoted or restarted)."""
    try:
        return str(status(broker, timeout=timeout)["role"])
    except Exception:  # noqa: BLE001 - not answering for a moment is what this asks about
        return None


def acting_master(group: GroupCluster) -> BrokerProcess | None:
    """The replica that has taken office, if one has."""
    return next((b for b in group.replicas if role(b) == "master"), None)


@contextlib.contextmanager
def running(cluster: GroupCluster) -> Iterator[GroupCluster]:
    """Start ``cluster``; afterwards kill it and print what each process said last (pytest
    shows it when the test fails)."""
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.kill()
        for broker in cluster.brokers:
            print(f"--- {broker.name}\n" + "".join(broker.output[-40:]))
        if cluster.proxy is not None:
            print("--- proxy\n" + cluster.proxy.log_tail())


def held(broker: BrokerProcess, topic: str, queues: int) -> int:
    """How many messages of ``topic`` the member's own consume queues hold."""
    return sum(status(broker, [(topic, q) for q in range(queues)])["max_offsets"])


def receive_all(address: str, at_least: int, timeout: float) -> list[str]:
    """Every body of ``orders`` the official client's consumer group ``readers`` receives
    through ``address``: at least ``at_least``, then until two receives come back empty."""
    config = ClientConfiguration(address, Credentials(), request_timeout=10)
    consumer = SimpleConsumer(config, "readers", {"orders": FilterExpression()}, await_duration=1)
    consumer.startup()
    got: list[str] = []
    empty_after_enough = 0
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and empty_after_enough < 2:
            batch = consumer.receive(32, 30)
            if not batch and len(got) >= at_least:
                empty_after_enough += 1
            for msg in batch:
                got.append(msg.body.decode())
                consumer.ack(msg)
    finally:
        consumer.shutdown()
    return got
