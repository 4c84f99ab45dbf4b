"""A real etcd for the cluster tests: free loopback ports, its own data directory.

:class:`EtcdServer` starts the ``etcd`` binary (Debian's ``etcd-server``, which
``./run test`` installs), waits with a deadline until it answers, and can be
SIGKILLed and restarted on the same data directory and ports, as a crash and a
restart of the coordinator. Where etcd is missing the tests are skipped, except
under ``CI=true``, where that is a failure: CI must run them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

READY_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def etcd_binary() -> str:
    found = shutil.which("etcd")
    if found is None:
        message = "etcd is not installed (./run test installs Debian's etcd-server)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; CI must run the cluster tests")
        pytest.skip(message)
    return found


@dataclass(frozen=True)
class EtcdTls:
    """etcd's client port over TLS (``--cert-file``/``--key-file``) and, with
    ``client_cert_auth``, only for callers with a certificate ``ca`` signed."""

    ca: Path
    cert: Path
    key: Path
    # A client certificate of the test's, for the readiness probe.
    client_cert: Path
    client_key: Path
    client_cert_auth: bool = True


PORT_ATTEMPTS = 3


class EtcdServer:
    def __init__(self, data_dir: Path, tls: EtcdTls | None = None) -> None:
        self.binary = etcd_binary()
        self.tls = tls
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        """The coordinator address halfmoon takes: ``etcd://HOST:PORT``."""
        return f"etcd://{self.address}"

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def _tls_flags(self) -> list[str]:
        if self.tls is None:
            return []
        flags = [f"--cert-file={self.tls.cert}", f"--key-file={self.tls.key}"]
        if self.tls.client_cert_auth:
            flags += ["--client-cert-auth", f"--trusted-ca-file={self.tls.ca}"]
        return flags

    def _probe_context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        return context

    def start(self) -> None:
        """Start etcd; a first start whose ports another process took meanwhile (they are
        picked ahead, and etcd reports no port of its own choosing) tries fresh ones. A
        restart keeps its ports: the clients under test know them."""
        first = self.process is None
        for attempt in range(PORT_ATTEMPTS):
            try:
                return self._start_once()
            except RuntimeError as error:
                taken = "address already in use" in str(error)
                if not (first and taken) or attempt == PORT_ATTEMPTS - 1:
                    raise
                self.client_port, self.peer_port = free_port(), free_port()
                shutil.rmtree(self.data_dir, ignore_errors=True)

    def _start_once(self) -> None:
        client = f"{self.scheme}://{self.address}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    self.binary,
                    "--name=halfmoon-test",
                    f"--data-dir={self.data_dir}",
                    f"--listen-client-urls={client}",
                    f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=halfmoon-test={peer}",
                    "--initial-cluster-state=new",
                    # No fsync per write: these tests crash the process, not the machine.
                    "--unsafe-no-fsync",
                    "--log-level=warn",
                    *self._tls_flags(),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.process.returncode}: {self.log_tail()}")
            try:
                request = urllib.request.Request(
                    f"{self.scheme}://{self.address}/v3/kv/range",
                    data=json.dumps({"key": "AA=="}).encode(),
                    method="POST",
                )
                context = self._probe_context()
                with urllib.request.urlopen(request, timeout=1, context=context) as response:
                    if response.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"etcd did not answer within {READY_TIMEOUT} s: {self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL etcd, as a crash: no shutdown, whatever it was doing."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP etcd: connections stay open and nothing answers, as a hung server."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Start etcd again on the same data directory and ports."""
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a paused etcd cannot act on SIGTERM
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
