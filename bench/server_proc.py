"""A real ``halfmoon serve`` subprocess for the endpoint benchmark.

The benchmark measures the broker the way users run it: a separate process
on loopback, its own temporary data directory, free ports. ``--flush async``
(acknowledge after the write) is the default; ``flush="sync"`` acknowledges
after fsync (group commit) for the like-for-like durability comparison.

    with HalfmoonServer(flush="async") as server:
        server.create_topic("BenchTopic", queues=8)
        ... connect to server.grpc ...
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Literal

REPO_ROOT = Path(__file__).resolve().parents[1]
READY_LINE = "halfmoon ready"
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 20.0
# Small segments keep preallocation modest; the benchmark writes well under 1 GiB.
SEGMENT_SIZE = "64MiB"

Flush = Literal["async", "sync"]


class ServerError(RuntimeError):
    """The server did not start, answer, or stop as expected (its log tail is in the message)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HalfmoonServer:
    """One ``halfmoon serve`` process; ``grpc`` is HOST:PORT for the clients."""

    def __init__(
        self,
        *,
        flush: Flush = "async",
        data_dir: Path | None = None,
        settings: tuple[str, ...] = (),
        ready_timeout: float = READY_TIMEOUT,
    ) -> None:
        self.flush = flush
        self._own_dir = data_dir is None
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix="halfmoon-bench-"))
        self.settings = (f"store.segment_size={SEGMENT_SIZE}", *settings)
        self.ready_timeout = ready_timeout
        self.grpc_port = free_port()
        self.admin_port = free_port()
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ServerError("the server is not started")
        return self.proc.pid

    # -- lifecycle -------------------------------------------------------------

    def command(self) -> list[str]:
        """The command line of the process (a subclass starts another kind)."""
        cmd = [
            sys.executable, "-m", "halfmoon", "serve",
            "--data-dir", str(self.data_dir),
            "--listen", self.grpc,
            "--admin-listen", f"127.0.0.1:{self.admin_port}",
            "--amqp-listen", "127.0.0.1:0",
            "--flush", self.flush,
        ]  # fmt: skip
        for setting in self.settings:
            cmd += ["--set", setting]
        return cmd

    def start(self) -> HalfmoonServer:
        """Start the process and wait (with a deadline) for its ready line."""
        cmd = self.command()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self._ready.clear()
        self.proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + self.ready_timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                raise ServerError(
                    f"halfmoon serve exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise ServerError(
                    f"halfmoon serve not ready within {self.ready_timeout}s:\n{self.log_tail()}"
                )
        return self

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        # Read the log continuously so a chatty server never blocks on a full pipe.
        assert proc.stdout is not None
        for line in proc.stdout:
            if len(self.lines) < 10_000:
                self.lines.append(line.rstrip("\n"))
            if READY_LINE in line:
                self._ready.set()

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.lines[-n:])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int:
        """SIGTERM, wait for the clean exit, remove the data directory we made; the exit status."""
        try:
            if self.proc is None:
                return 0
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
                raise ServerError(
                    f"halfmoon serve did not stop within {STOP_TIMEOUT}s:\n{self.log_tail()}"
                ) from None
        finally:
            if self._own_dir:
                shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> HalfmoonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        except ServerError:
            if exc[0] is None:
                raise

    # -- admin -------------------------------------------------------------------

    def admin_call(self, method: str, path: str, body: dict | None = None) -> object:
        """One admin API call; the decoded JSON answer, or ServerError on an HTTP error."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.admin + path,
            data=data,
            method=method,
            headers={"content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise ServerError(f"{method} {path} answered {exc.code}: {detail}") from None
        return json.loads(raw) if raw else None

    def create_topic(self, name: str, *, queues: int = 8, message_type: str = "normal") -> None:
        body = {"name": name, "message_type": message_type, "queue_count": queues, "perm": "rw"}
        self.admin_call("POST", "/v1/topics", body)

    def create_group(self, name: str, *, consume_from: str = "earliest") -> None:
        with contextlib.suppress(ServerError):  # a group may exist already (auto-created)
            self.admin_call("POST", "/v1/groups", {"name": name, "consume_from": consume_from})
