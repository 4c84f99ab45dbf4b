"""A cluster of real processes on a virtual network: etcd, brokers and a proxy, a host each.

The test process is the client, reaching the proxy through the bridge.
"""

from __future__ import annotations

from pathlib import Path

from tests.cluster.broker_processes import BrokerProcess
from tests.netns import processes
from tests.netns.network import Host, VirtualNetwork

LEASE_TTL_S = 2  # etcd's smallest lease: a partitioned member is gone within 2 s


class NetCluster:
    """``etcd`` members, ``brokers`` (by name) and one proxy, each on its own host."""

    def __init__(
        self,
        network: VirtualNetwork,
        root: Path,
        *,
        cluster: str = "net",
        brokers: tuple[str, ...] = ("broker-a", "broker-b"),
        etcd_members: int = 1,
        broker_flags: tuple[str, ...] = (),
    ) -> None:
        self.network = network
        self.name = cluster
        etcd_hosts = [network.add_host(f"etcd{i + 1}") for i in range(etcd_members)]
        self.etcd = processes.EtcdCluster(etcd_hosts, root / "etcd")
        self.broker_hosts: dict[str, Host] = {}
        self.brokers: dict[str, BrokerProcess] = {}
        for name in brokers:
            host = network.add_host(name)
            self.broker_hosts[name] = host
            self.brokers[name] = processes.broker(
                host, root / name, "--cluster", cluster, "--coordinator", self.etcd.url,
                "--lease-ttl", str(LEASE_TTL_S), *broker_flags, name=name,
            )  # fmt: skip
        self.proxy_host = network.add_host("proxy")
        self.proxy = processes.NetProxy(self.proxy_host, root / "proxy", self.etcd.url, cluster)

    @property
    def etcd_hosts(self) -> list[Host]:
        return [member.host for member in self.etcd.members]

    def start(self) -> NetCluster:
        self.etcd.start()
        for broker in self.brokers.values():
            broker.start()
        self.proxy.start()
        return self

    def kill(self) -> None:
        self.proxy.kill()
        for broker in self.brokers.values():
            broker.kill()
        self.etcd.stop()
