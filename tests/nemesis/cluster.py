"""The cluster the nemesis run attacks: three etcd members, one broker group (a master and two
replicas, sync replication) and two proxies, each on its own host of a virtual network.

Every part can be SIGKILLed and restarted (same data directory, same
address), paused (SIGSTOP) and resumed (SIGCONT), or cut off from every other
host and from the test process. One etcd member (``etcd3``) is the nemesis's:
the other two keep a quorum.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

from halfmoon.replication.keys import GroupKeys
from tests.cluster.broker_processes import BrokerProcess
from tests.netns import processes
from tests.netns.network import Host, VirtualNetwork

CLUSTER = "nem"
GROUP = "g1"
LEASE_TTL_S = 2
TOPICS = {"plain": ("normal", 4), "fifo": ("fifo", 4), "txn": ("transaction", 2)}
CONSUMER_GROUPS = {"plain": {}, "fifo": {"fifo": True}, "txn": {}}


class Part:
    """One process of the cluster, by name, as the nemesis sees it."""

    def __init__(self, name: str, host: Host, cluster: NemesisCluster) -> None:
        self.name = name
        self.host = host
        self.cluster = cluster
        self.paused = False

    def process(self) -> subprocess.Popen[str] | subprocess.Popen[bytes] | None:
        thing = self.cluster.processes[self.name]
        if isinstance(thing, BrokerProcess):
            return thing.process
        if isinstance(thing, processes.EtcdMember):
            return thing.process
        return thing.proc

    def alive(self) -> bool:
        proc = self.process()
        return proc is not None and proc.poll() is None

    def signal(self, number: int) -> None:
        proc = self.process()
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, number)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        self.resume()  # a stopped process dies only once resumed
        self.signal(signal.SIGKILL)
        proc = self.process()
        if proc is not None:
            proc.wait(timeout=10)

    def start(self) -> None:
        thing = self.cluster.processes[self.name]
        thing.start()


class NemesisCluster:
    def __init__(self, network: VirtualNetwork, root: Path) -> None:
        self.network = network
        etcd_hosts = [network.add_host(f"etcd{i + 1}") for i in range(3)]
        self.etcd = processes.EtcdCluster(etcd_hosts, root / "etcd")
        self.brokers: list[BrokerProcess] = []
        flags = (
            "--cluster", CLUSTER, "--coordinator", self.etcd.url,
            "--lease-ttl", str(LEASE_TTL_S), "--group", GROUP, "--replication", "sync",
            "--min-insync-replicas", "1", "--replica-max-lag-ms", "1500",
            "--set", "store.segment_size=1048576",
        )  # fmt: skip
        broker_hosts = [network.add_host(f"b{i}") for i in range(3)]
        for host in broker_hosts:
            self.brokers.append(processes.broker(host, root / host.name, *flags, name=host.name))
        proxy_hosts = [network.add_host(f"proxy{i + 1}") for i in range(2)]
        self.proxies = [
            processes.NetProxy(host, root / host.name, self.etcd.url, CLUSTER)
            for host in proxy_hosts
        ]
        self.processes: dict[str, processes.EtcdMember | BrokerProcess | processes.NetProxy] = {
            **{m.host.name: m for m in self.etcd.members},
            **{b.name: b for b in self.brokers},
            **{p.host.name: p for p in self.proxies},
        }
        hosts = {**{h.name: h for h in etcd_hosts + broker_hosts + proxy_hosts}}
        self.parts = {name: Part(name, hosts[name], self) for name in self.processes}

    @property
    def endpoints(self) -> list[str]:
        return [proxy.address for proxy in self.proxies]

    def start(self) -> NemesisCluster:
        self.etcd.start()
        for broker in self.brokers:
            broker.start()  # in order: b0 is the first master
        for proxy in self.proxies:
            proxy.start()
        for topic, (kind, queues) in TOPICS.items():
            self.proxies[0].create_topic(topic, kind, queues=queues)
        for topic, fields in CONSUMER_GROUPS.items():
            self.proxies[0].create_group(f"c-{topic}", **fields)
        return self

    def targets(self) -> list[Part]:
        """What the nemesis may attack: brokers, proxies and one etcd member of three."""
        names = [b.name for b in self.brokers] + [p.host.name for p in self.proxies] + ["etcd3"]
        return [self.parts[name] for name in names]

    def key(self, key: str) -> object:
        """The JSON value of ``key`` in etcd (None when absent), asked of etcd1."""
        request = urllib.request.Request(
            f"http://{self.etcd.members[0].address}/v3/kv/range",
            data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode(),
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            found = json.loads(response.read()).get("kvs")
        return json.loads(base64.b64decode(found[0]["value"])) if found else None

    def group_state(self) -> str:
        """The group's master, epoch and in-sync set in etcd, and what its members complained of."""
        keys = GroupKeys(CLUSTER, GROUP)
        lines = [f"master {self.key(keys.master)}, in-sync {self.key(keys.isr)}"]
        for broker in self.brokers:
            complaints = [line.strip() for line in broker.output if "REFUSED" in line]
            lines.append(f"{broker.name}: {len(complaints)} lines naming REFUSED")
            lines += [f"  {line[:300]}" for line in complaints[-2:]]
        return "\n".join(lines)

    def kill(self) -> None:
        for part in self.parts.values():
            if part.alive():
                part.kill()
