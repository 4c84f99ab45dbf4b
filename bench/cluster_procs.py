"""Cluster-mode processes for benchmarks: one ``halfmoon broker`` and proxies in front of it.

Either a proxy stands in front of the broker alone (``--broker ADDRESS``) or both
join a cluster in etcd (``--coordinator``/``--cluster``), which ``--workers N``
needs.

A :class:`ProxyServer` has :class:`~bench.server_proc.HalfmoonServer`'s interface (gRPC
and admin addresses, ``create_topic``), so the load generators drive it as they drive
``halfmoon serve``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bench.server_proc import REPO_ROOT, HalfmoonServer, ServerError

BROKER_READY = re.compile(r"halfmoon broker ready .*internal=(\S+)")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0


class BrokerServer:
    """One ``halfmoon broker`` on a free loopback port; ``address`` is its internal endpoint."""

    def __init__(
        self,
        *,
        flush: str = "async",
        name: str = "b1",
        cluster: tuple[str, ...] = (),
        extra: tuple[str, ...] = (),
    ) -> None:
        self.flush = flush
        self.extra = extra  # more flags, e.g. ("--send-listen", "off")
        self.name = name
        self.cluster = cluster  # --cluster NAME --coordinator URL, to register in etcd
        self.data_dir = Path(tempfile.mkdtemp(prefix="halfmoon-bench-broker-"))
        self.address = ""
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ServerError("the broker is not started")
        return self.proc.pid

    def start(self) -> BrokerServer:
        command = [
            sys.executable, "-m", "halfmoon", "broker",
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen", "127.0.0.1:0",
            "--flush", self.flush,
            *self.cluster,
            *self.extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            command, cwd=REPO_ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        ready = threading.Event()

        def drain(stream: object) -> None:  # reads on, so a chatty broker never blocks
            for line in stream:  # type: ignore[attr-defined]
                if len(self.lines) < 10_000:
                    self.lines.append(line.rstrip("\n"))
                match = BROKER_READY.search(line)
                if match and not self.address:
                    self.address = match.group(1)
                    ready.set()
            ready.set()  # the process ended

        threading.Thread(target=drain, args=(self.proc.stderr,), daemon=True).start()
        ready.wait(START_TIMEOUT_S)
        if not self.address:
            self.stop()
            raise ServerError("halfmoon broker not ready:\n" + "\n".join(self.lines[-30:]))
        return self

    def stop(self) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
        finally:
            shutil.rmtree(self.data_dir, ignore_errors=True)


class ProxyServer(HalfmoonServer):
    """``halfmoon proxy`` on free ports (it stores nothing): in front of ``broker`` alone, or,
    given ``cluster`` (``--cluster NAME --coordinator URL``), of the cluster's brokers with
    ``workers`` worker processes sharing the port."""

    def __init__(
        self, broker: BrokerServer, *, cluster: tuple[str, ...] = (), workers: int = 1
    ) -> None:
        super().__init__()
        self.settings = ()  # the store's keys are the broker's
        self.broker = broker
        self.cluster = cluster
        self.workers = workers

    def command(self) -> list[str]:
        upstream = (
            [*self.cluster, "--workers", str(self.workers)]
            if self.cluster
            else ["--broker", self.broker.address]
        )
        return [
            sys.executable, "-m", "halfmoon", "proxy", *upstream,
            "--listen", self.grpc,
            "--admin-listen", f"127.0.0.1:{self.admin_port}",
            "--amqp-listen", "",  # not measured here; its default port may be another's
        ]  # fmt: skip

    def worker_pids(self) -> list[int]:
        """The worker processes (the parent's children; none with one worker in-process)."""
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        return [int(pid) for pid in children]
