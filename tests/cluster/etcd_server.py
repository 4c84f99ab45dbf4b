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
import subprocess
import time
import urllib.error
import urllib.request
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


class EtcdServer:
    def __init__(self, data_dir: Path) -> None:
        self.binary = etcd_binary()
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

    def start(self) -> None:
        client = f"http://{self.address}"
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
                    f"http://{self.address}/v3/kv/range",
                    data=json.dumps({"key": "AA=="}).encode(),
                    method="POST",
                )
                with urllib.request.urlopen(request, timeout=1) as response:
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
