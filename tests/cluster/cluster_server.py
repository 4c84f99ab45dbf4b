"""A real cluster driven as one server: etcd, two brokers, two proxies, each its own process.

:class:`ClusterServer` has :class:`~tests.server.conftest.ServerProcess`'s
interface, so tests written against ``halfmoon serve`` run unchanged against
the cluster: ``grpc`` names both proxies (``a;b``: the official clients fail
over between them), ``admin`` is the first proxy's admin API. The parts are
reachable for failure tests: ``etcd``, ``brokers``, ``proxies``.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

from tests.cluster.broker_processes import BrokerProcess
from tests.cluster.etcd_server import EtcdServer, EtcdTls
from tests.server.conftest import ServerProcess

# Re-exported: the cluster and partition tests import it from here.
from tests.waiting import wait_until as wait_until

_clusters = itertools.count()
# The configuration sections only proxies take; the others (store, broker, transaction)
# are the brokers', but for TLS to etcd and on the internal protocol, which both take.
PROXY_SECTIONS = ("server.", "auth.", "tls.")
SHARED_SECTIONS = ("etcd.", "internal.")


class ClusterProxy(ServerProcess):
    """One ``halfmoon proxy --cluster`` process."""

    binds_port_zero = False  # named after its port, which its workers share

    def __init__(
        self,
        data_dir: Path,
        etcd: EtcdServer,
        cluster: str,
        workers: int = 1,
        lease_ttl: int = 2,
        **kwargs: object,
    ) -> None:
        super().__init__(data_dir, **kwargs)  # type: ignore[arg-type]
        self.etcd = etcd
        self.cluster = cluster
        self.workers = workers
        self.lease_ttl = lease_ttl

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "halfmoon", "proxy",
            "--coordinator", self.etcd.url,
            "--cluster", self.cluster,
            "--name", f"proxy-{self.grpc_port}",
            "--lease-ttl", str(self.lease_ttl),
            "--listen", self.address,
            "--admin-listen", f"127.0.0.1:{self.admin_port}",
            "--workers", str(self.workers),
        ]  # fmt: skip
        for setting in self.settings:  # the store and transaction keys are the brokers'
            if setting.startswith(PROXY_SECTIONS + SHARED_SECTIONS):
                cmd += ["--set", setting]
        return cmd


class ClusterServer(ClusterProxy):
    """etcd, brokers ``broker-a`` and ``broker-b``, and two proxies; this object is the first
    proxy, ``proxies[1]`` the second."""

    def __init__(
        self,
        data_dir: Path,
        *,
        brokers: int = 2,
        etcd_tls: EtcdTls | None = None,
        # Long enough that a loaded machine's late renewal never drops a live broker from the
        # routes (the scenarios here do not wait for a lease); tests of lease expiry pass 2.
        broker_lease_ttl: int = 10,
        **kwargs: object,
    ) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.own_etcd = EtcdServer(data_dir / "etcd", etcd_tls)
        cluster = f"c{next(_clusters)}"
        super().__init__(data_dir, self.own_etcd, cluster, **kwargs)
        broker_settings = [s for s in self.settings if not s.startswith(PROXY_SECTIONS)]
        extra = tuple(arg for setting in broker_settings for arg in ("--set", setting))
        self.brokers = [
            BrokerProcess(
                data_dir / f"broker-{letter}",
                name=f"broker-{letter}",
                extra=(
                    "--cluster",
                    cluster,
                    "--coordinator",
                    self.own_etcd.url,
                    "--lease-ttl",
                    str(broker_lease_ttl),
                    *extra,
                ),  # fmt: skip
            )
            for letter in "ab"[:brokers]
        ]
        self.proxies: list[ClusterProxy] = [
            self,
            ClusterProxy(
                data_dir / "proxy-2",
                self.own_etcd,
                cluster,
                settings=self.settings,
                env=self.env,
                credentials=self.credentials,
            ),
        ]

    @property
    def grpc(self) -> str:
        return ";".join(proxy.address for proxy in self.proxies)

    def start(self, timeout: float = 60.0) -> ClusterServer:
        if self.own_etcd.process is None or self.own_etcd.process.poll() is not None:
            self.own_etcd.start()
        for broker in self.brokers:
            if broker.process is None or broker.process.poll() is not None:
                broker.start()
        super().start(timeout)
        if not self.proxies[1].alive():
            ClusterProxy.start(self.proxies[1], timeout)
        return self

    def kill_proxy(self, index: int) -> None:
        """SIGKILL one proxy (``kill`` would kill the whole cluster)."""
        ServerProcess.kill(self.proxies[index])

    def restart_broker(self, index: int) -> None:
        self.brokers[index].start()

    def stop(self, timeout: float = 20.0) -> int:
        try:
            status = super().stop(timeout)
            if self.proxies[1].alive():
                assert self.proxies[1].stop(timeout) == 0, self.proxies[1].log_tail()
            return status
        finally:
            for broker in self.brokers:
                if broker.process is not None and broker.process.poll() is None:
                    assert broker.stop(timeout) == 0, "".join(broker.output[-30:])
            self.own_etcd.stop()

    def kill(self) -> None:
        for proxy in self.proxies:
            ServerProcess.kill(proxy)
        for broker in self.brokers:
            broker.kill()
        self.own_etcd.stop()
