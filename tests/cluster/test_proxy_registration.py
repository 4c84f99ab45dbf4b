"""A cluster proxy is listed in etcd only once it serves: one that cannot bind its ports is
never shown live by ``cluster list``, and exits with an error (a real ``halfmoon proxy``
process, alone and as a supervisor of workers)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_cli import halfmoon, ok
from tests.cluster.broker_processes import BrokerProcess
from tests.cluster.etcd_server import EtcdServer, free_port
from tests.server.conftest import ROOT

EXIT_TIMEOUT_S = 60.0
CLUSTER = "registration"


@pytest.fixture(scope="module")
def broker(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """The cluster's one broker: a proxy that finds none refuses to start for that reason."""
    extra = ("--cluster", CLUSTER, "--coordinator", etcd.url)
    process = BrokerProcess(tmp_path_factory.mktemp("broker"), extra=extra).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port some other program listens on (without SO_REUSEPORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def _proxies(etcd: EtcdServer, cluster: str) -> list[str]:
    args = ("cluster", "list", "--coordinator", etcd.url, "--cluster", cluster, "--json")
    return [p["name"] for p in json.loads(ok(halfmoon(*args)))["proxies"]]


def _proxy(
    etcd: EtcdServer, log: Path, grpc_port: int, admin_port: int, workers: int
) -> subprocess.Popen[bytes]:
    """``halfmoon proxy`` named p1, its stderr in ``log``."""
    command = [sys.executable, "-m", "halfmoon", "proxy", "--coordinator", etcd.url]
    command += ["--cluster", CLUSTER, "--name", "p1", "--lease-ttl", "2"]
    command += ["--listen", f"127.0.0.1:{grpc_port}", "--admin-listen", f"127.0.0.1:{admin_port}"]
    command += ["--workers", str(workers)]
    with log.open("wb") as stderr:
        return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)


def _stop(proxy: subprocess.Popen[bytes]) -> None:
    if proxy.poll() is None:
        proxy.kill()
    proxy.wait(30)


@pytest.mark.parametrize(("workers", "taken"), [(1, "admin"), (2, "grpc")])
def test_a_proxy_that_cannot_bind_is_never_listed(
    etcd: EtcdServer,
    broker: BrokerProcess,
    taken_port: int,
    workers: int,
    taken: str,
    tmp_path: Path,
) -> None:
    grpc_port = taken_port if taken == "grpc" else free_port()
    admin_port = taken_port if taken == "admin" else free_port()
    log = tmp_path / "proxy.log"
    proxy = _proxy(etcd, log, grpc_port, admin_port, workers)
    try:
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while proxy.poll() is None:
            assert time.monotonic() < deadline, "the proxy neither served nor exited"
            assert _proxies(etcd, CLUSTER) == [], "listed while it cannot serve"
        assert proxy.returncode != 0
        assert "address already in use" in log.read_text().lower(), log.read_text()[-3000:]
        assert _proxies(etcd, CLUSTER) == []
    finally:
        _stop(proxy)


def test_a_proxy_that_serves_is_listed_with_its_workers(
    etcd: EtcdServer, broker: BrokerProcess, tmp_path: Path
) -> None:
    log = tmp_path / "proxy.log"
    proxy = _proxy(etcd, log, free_port(), free_port(), 2)
    try:
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while _proxies(etcd, CLUSTER) != ["p1"]:
            assert proxy.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "never listed"
            time.sleep(0.1)
        proxy.terminate()
        assert proxy.wait(30) == 0
        assert _proxies(etcd, CLUSTER) == []  # deregistered on the way out
    finally:
        _stop(proxy)
