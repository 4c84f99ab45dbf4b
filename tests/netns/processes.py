"""etcd, brokers and proxies started inside the hosts of a :class:`VirtualNetwork`.

Each listens on its host's own address with fixed ports (a namespace has all its
ports free); the test process reaches them through the bridge. The broker and
the proxy are the cluster tests' own process classes, run under
``ip netns exec`` and with ``--insecure`` (a non-loopback listener without TLS:
the network exists only inside this machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.cluster.broker_processes import BrokerProcess
from tests.cluster.cluster_server import PROXY_SECTIONS, SHARED_SECTIONS, ClusterProxy
from tests.cluster.etcd_server import EtcdServer, etcd_binary
from tests.netns.network import Host

ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
BROKER_PORT = 8091
PROXY_PORT = 8081
PROXY_ADMIN_PORT = 8082
PROXY_AMQP_PORT = 5673
READY_TIMEOUT = 30.0


class EtcdMember:
    """One member of an etcd cluster, inside ``host``."""

    def __init__(self, host: Host, data_dir: Path, cluster: list[Host]) -> None:
        self.binary = etcd_binary()
        self.host = host
        self.data_dir = data_dir
        self.cluster = cluster
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def address(self) -> str:
        return f"{self.host.ip}:{ETCD_CLIENT_PORT}"

    def start(self) -> EtcdMember:
        peers = ",".join(f"{h.name}=http://{h.ip}:{ETCD_PEER_PORT}" for h in self.cluster)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.host.wrap([
                    self.binary,
                    f"--name={self.host.name}",
                    f"--data-dir={self.data_dir}",
                    f"--listen-client-urls=http://{self.address}",
                    f"--advertise-client-urls=http://{self.address}",
                    f"--listen-peer-urls=http://{self.host.ip}:{ETCD_PEER_PORT}",
                    f"--initial-advertise-peer-urls=http://{self.host.ip}:{ETCD_PEER_PORT}",
                    f"--initial-cluster={peers}",
                    "--initial-cluster-state=new",
                    "--unsafe-no-fsync",  # these tests cut networks, not power
                    "--log-level=warn",
                ]),
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        return self

    def ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"etcd {self.host.name} exited: {self.log_tail()}")
        request = urllib.request.Request(
            f"http://{self.address}/v3/kv/range", data=json.dumps({"key": "AA=="}).encode()
        )
        try:
            with urllib.request.urlopen(request, timeout=1) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def log_tail(self, lines: int = 20) -> str:
        return EtcdServer.log_tail(self, lines)  # type: ignore[arg-type]

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


class EtcdCluster:
    """etcd members, one per host, as one coordinator (``url`` names them all)."""

    def __init__(self, hosts: list[Host], root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.members = [EtcdMember(host, root / f"etcd-{host.name}", hosts) for host in hosts]

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(member.address for member in self.members)

    def start(self) -> EtcdCluster:
        for member in self.members:
            member.start()
        deadline = time.monotonic() + READY_TIMEOUT
        waiting = list(self.members)
        while waiting:
            waiting = [member for member in waiting if not member.ready()]
            if time.monotonic() > deadline:
                tails = "\n".join(m.log_tail() for m in waiting)
                raise RuntimeError(f"etcd did not answer within {READY_TIMEOUT} s:\n{tails}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        for member in self.members:
            member.kill()


def broker(host: Host, data_dir: Path, *extra: str, name: str | None = None) -> BrokerProcess:
    """A (not yet started) broker inside ``host``, on its address."""
    return BrokerProcess(
        data_dir,
        name=name or host.name,
        extra=("--insecure", *extra),
        wrapper=tuple(host.wrap([])),
        address=f"{host.ip}:{BROKER_PORT}",
    )


class NetProxy(ClusterProxy):
    """A ``halfmoon proxy --cluster`` inside ``host``."""

    def __init__(
        self, host: Host, data_dir: Path, coordinator: str, cluster: str, **kwargs: object
    ) -> None:
        self.host = host
        self.coordinator = coordinator
        super().__init__(
            data_dir,
            None,  # type: ignore[arg-type]  # no EtcdServer: ``coordinator`` names the members
            cluster,
            grpc_port=PROXY_PORT,
            admin_port=PROXY_ADMIN_PORT,
            **kwargs,
        )

    @property
    def address(self) -> str:
        return f"{self.host.ip}:{self.grpc_port}"

    @property
    def grpc(self) -> str:
        return self.address

    @property
    def admin(self) -> str:
        return f"http://{self.host.ip}:{self.admin_port}"

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "halfmoon", "proxy",
            "--coordinator", self.coordinator,
            "--cluster", self.cluster,
            "--name", self.host.name,
            "--lease-ttl", "2",
            "--listen", self.address,
            "--admin-listen", f"{self.host.ip}:{self.admin_port}",
            "--amqp-listen", f"{self.host.ip}:{PROXY_AMQP_PORT}",
            "--insecure",
        ]  # fmt: skip
        for setting in self.settings:  # the store keys are the brokers'
            if setting.startswith(PROXY_SECTIONS + SHARED_SECTIONS):
                cmd += ["--set", setting]
        return self.host.wrap(cmd)
