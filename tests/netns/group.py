"""A broker group on a virtual network: etcd, a master and replicas, and a proxy, a host each.

The first broker started wins the group's master key and is its master. The
test process reads the group's keys straight from etcd (:meth:`NetGroup.key`)
and members' replication ``Status`` through the bridge.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from halfmoon.replication.keys import GroupKeys
from tests.cluster.broker_processes import BrokerProcess
from tests.netns import processes
from tests.netns.network import Host, VirtualNetwork
from tests.replication.group_cluster import status

CLUSTER = "net"
GROUP = "g1"
LEASE_TTL_S = 2


class NetGroup:
    def __init__(
        self,
        network: VirtualNetwork,
        root: Path,
        *,
        replicas: int = 2,
        mode: str = "sync",
        min_insync: int = 1,
        max_lag_ms: int = 1500,
    ) -> None:
        self.network = network
        self.keys = GroupKeys(CLUSTER, GROUP)
        self.etcd = processes.EtcdCluster([network.add_host("etcd1")], root / "etcd")
        self.hosts: list[Host] = []
        self.brokers: list[BrokerProcess] = []
        for i in range(replicas + 1):
            host = network.add_host(f"b{i}")
            self.hosts.append(host)
            self.brokers.append(
                processes.broker(
                    host,
                    root / f"b{i}",
                    "--cluster",
                    CLUSTER,
                    "--coordinator",
                    self.etcd.url,
                    "--lease-ttl",
                    str(LEASE_TTL_S),
                    "--group",
                    GROUP,
                    "--replication",
                    mode,
                    "--min-insync-replicas",
                    str(min_insync),
                    "--replica-max-lag-ms",
                    str(max_lag_ms),
                    "--set",
                    "store.segment_size=1048576",
                    name=f"b{i}",
                )  # fmt: skip
            )
        self.proxy_host = network.add_host("proxy")
        self.proxy = processes.NetProxy(self.proxy_host, root / "proxy", self.etcd.url, CLUSTER)

    def start(self) -> NetGroup:
        self.etcd.start()
        for broker in self.brokers:
            broker.start()  # in order: the first is the master
        self.proxy.start()
        return self

    def status(self, index: int, queues: Sequence[tuple[str, int]] = ()) -> dict[str, Any]:
        return status(self.brokers[index], queues)

    def key(self, key: str) -> dict[str, Any] | None:
        """The JSON value of ``key`` in etcd (None when absent), read from the test process."""
        request = urllib.request.Request(
            f"http://{self.etcd.members[0].address}/v3/kv/range",
            data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode(),
        )
        with urllib.request.urlopen(request, timeout=2) as response:
            found = json.loads(response.read()).get("kvs")
        return json.loads(base64.b64decode(found[0]["value"])) if found else None

    def kill(self) -> None:
        self.proxy.kill()
        for broker in self.brokers:
            broker.kill()
        self.etcd.stop()


class KeyWatch:
    """Polls one key every few milliseconds: when it was last seen and first seen gone."""

    def __init__(self, group: NetGroup, key: str) -> None:
        self.group = group
        self.key = key
        self.last_present = 0.0
        self.first_absent: float | None = None
        self.value: dict[str, Any] | None = None

    def poll(self) -> None:
        asked = time.time()
        value = self.group.key(self.key)
        if value is not None:
            self.value = value
            self.last_present = asked  # it existed at least until then
        elif self.first_absent is None:
            self.first_absent = time.time()  # it was gone by then
