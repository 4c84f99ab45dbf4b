"""A broker group with mutual TLS on the internal protocol: replicas follow the master over
TLS with cluster certificates, and nobody without one reaches the replication service.

Real processes (etcd, a master, two replicas, a proxy), every broker and the proxy with
``[internal]`` set; sync replication with ``min_insync_replicas=2``, so an acknowledged send
proves both replicas fetched it from the master through a mutually authenticated channel.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, Message, Producer

from halfmoon.replication import protocol
from tests.cluster.broker_processes import BrokerProcess
from tests.cluster.cluster_server import ClusterProxy
from tests.replication.group_cluster import CLUSTER, GroupCluster
from tests.waiting import wait_until

pytest.importorskip("cryptography")
from tests.server.certificates import CertificateAuthority, Issued  # noqa: E402

pytestmark = pytest.mark.slow


class TlsGroup(GroupCluster):
    """:class:`GroupCluster` with every broker and the proxy holding a cluster certificate."""

    def __init__(self, root: Path, ca: CertificateAuthority, peer: Issued, **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        self.tls = (f"internal.ca={ca.bundle}", f"internal.cert={peer.cert}",
                    f"internal.key={peer.key}")  # fmt: skip
        self.flags = self.flags + tuple(arg for s in self.tls for arg in ("--set", s))

    def start(self) -> TlsGroup:
        self.etcd.start()
        flags = list(self.flags)
        flags[flags.index("--coordinator") + 1] = self.etcd.url
        for broker in self.brokers:
            broker.extra = tuple(flags)
            broker.start()  # in order: the first is the master
        self.proxy = ClusterProxy(self.root / "proxy", self.etcd, CLUSTER, settings=self.tls)
        self.proxy.start()
        return self


@pytest.fixture
def pki(tmp_path: Path) -> tuple[CertificateAuthority, Issued]:
    (tmp_path / "pki").mkdir()
    ca = CertificateAuthority(tmp_path / "pki", "internal CA")
    return ca, ca.issue("halfmoon-peer")


@pytest.fixture
def group(tmp_path: Path, pki: tuple[CertificateAuthority, Issued]) -> Iterator[TlsGroup]:
    cluster = TlsGroup(tmp_path / "group", *pki, mode="sync", min_insync=2).start()
    try:
        yield cluster
    finally:
        cluster.kill()


def status(broker: BrokerProcess, credentials: grpc.ChannelCredentials) -> dict[str, Any]:
    with grpc.secure_channel(broker.address, credentials) as channel:
        call = channel.unary_unary(protocol.STATUS)
        return protocol.decode(call(protocol.encode({}), timeout=5))


def test_replicas_follow_the_master_over_mutual_tls(
    group: TlsGroup, pki: tuple[CertificateAuthority, Issued]
) -> None:
    ca, peer = pki
    cluster_cert = grpc.ssl_channel_credentials(
        ca.bundle.read_bytes(), peer.key.read_bytes(), peer.cert.read_bytes()
    )
    wait_until(lambda: status(group.master, cluster_cert)["isr"] == ["b1", "b2"], 20, "the ISR")
    assert group.proxy is not None
    group.proxy.create_topic("orders", "normal", queues=2)
    config = ClientConfiguration(group.proxy.address, Credentials(), request_timeout=5)
    client = Producer(config, ("orders",))
    client.startup()
    try:
        for i in range(5):
            msg = Message()
            msg.topic, msg.body = "orders", f"body-{i}".encode()
            client.send(msg)
    finally:
        client.shutdown()
    master_end = status(group.master, cluster_cert)["end_offset"]
    assert master_end > 0
    for replica in group.replicas:
        assert status(replica, cluster_cert)["visible_offset"] >= master_end
    # Without a cluster certificate the replication service does not answer at all.
    server_only = grpc.ssl_channel_credentials(ca.bundle.read_bytes())
    for credentials in (server_only, None):
        with pytest.raises(grpc.RpcError):
            if credentials is None:
                with grpc.insecure_channel(group.master.address) as plain:
                    plain.unary_unary(protocol.STATUS)(protocol.encode({}), timeout=3)
            else:
                status(group.master, credentials)
