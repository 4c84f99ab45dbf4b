"""A real ``halfmoon serve`` process for the server tests, and helpers around it.

The server runs as a subprocess (``python -m halfmoon serve``) on loopback
ports it binds itself (port 0, read back from its ready line) and its own data
directory; the fixture waits for the ready
line with a deadline. Modules share one server (the official client has
startup costs); tests that restart or kill it start their own.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.waiting import wait_until as wait_until  # re-exported: many tests import it from here

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 30.0

# Small segments keep each test server's disk footprint (and preallocation) modest.
DEFAULT_SETTINGS = ("store.segment_size=16MiB", "store.flush=async")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PortTaken(RuntimeError):
    """The server could not bind a port it was given: another process took it first."""


class ServerProcess:
    """One ``halfmoon serve`` subprocess; ``grpc`` is HOST:PORT for the clients (once started)."""

    # False for a server whose command line names its own port (a cluster proxy names
    # itself after it, and its workers share it): it is given free ports before the start.
    binds_port_zero = True
    # True: the process leads its own process group (os.killpg reaches it and its children).
    own_process_group = False

    def __init__(
        self,
        data_dir: Path,
        *,
        grpc_port: int | None = None,
        admin_port: int | None = None,
        settings: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.env = env or {}
        # (access key, secret key) for admin_call and cli, when authentication is on.
        self.credentials = credentials
        # Unless told which ports, the first start binds port 0 and reads the ports it got
        # from the ready line (restarts reuse them): no pick that another process can take
        # before the bind. A server that must know its port up front (binds_port_zero)
        # picks free ones and picks again when one was taken before the bind.
        self._repick_ports = grpc_port is None and admin_port is None and not self.binds_port_zero
        if self._repick_ports:
            grpc_port, admin_port = free_port(), free_port()
        self.grpc_port = grpc_port or 0
        self.admin_port = admin_port or 0
        self.settings = DEFAULT_SETTINGS + tuple(settings)
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()
        self.amqp_address = ""  # HOST:PORT of the AMQP listener, from the ready line

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "halfmoon", "serve",
            "--data-dir", str(self.data_dir),
            "--listen", self.grpc,
            "--admin-listen", f"127.0.0.1:{self.admin_port}",
        ]  # fmt: skip
        for setting in self.settings:
            cmd += ["--set", setting]
        if self.amqp_address and not any(
            setting.startswith("server.amqp_listen=") for setting in self.settings
        ):  # a restart serves AMQP where the first start's port 0 put it, as gRPC and admin
            cmd += ["--set", f"server.amqp_listen={self.amqp_address}"]
        return cmd

    def start(self, timeout: float = READY_TIMEOUT) -> ServerProcess:
        first_start = self.proc is None
        for attempt in range(3):
            try:
                return self._start(timeout)
            except PortTaken:
                if not (first_start and self._repick_ports) or attempt == 2:
                    raise
                self.grpc_port, self.admin_port = free_port(), free_port()
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> ServerProcess:
        self._ready.clear()
        first_line = len(self.lines)  # this start's output begins here
        cmd = self.command()
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            process_group=0 if self.own_process_group else None,
        )
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                taken = any("in use" in line for line in self.lines[first_line:])
                error = PortTaken if taken else RuntimeError
                raise error(
                    f"halfmoon serve exited with {self.proc.returncode}:\n" + self.log_tail()
                )
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"halfmoon serve not ready within {timeout}s:\n" + self.log_tail()
                )
        return self

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if "halfmoon ready" in line:
                self._learn_ports(line)
                self._ready.set()

    def _learn_ports(self, ready_line: str) -> None:
        """Take the ports a start on port 0 got from its ready line: ``grpc=H:P admin=H:P``
        in the text format, ``"grpc": "H:P"`` in the JSON one."""
        if ready_line.lstrip().startswith("{"):
            fields = {k: str(v) for k, v in json.loads(ready_line).items()}
        else:
            fields = dict(re.findall(r"\b(\w+)=(\S+)", ready_line))
        for key, attribute in (("grpc", "grpc_port"), ("admin", "admin_port")):
            found = re.search(r":(\d+)$", fields.get(key, ""))
            if found and getattr(self, attribute) == 0:
                setattr(self, attribute, int(found.group(1)))
        amqp = fields.get("amqp", "")
        self.amqp_address = amqp if re.search(r":\d+$", amqp) else ""

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.lines[-n:])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait for a clean exit; the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"halfmoon serve did not stop within {timeout}s after SIGTERM:\n{self.log_tail()}"
            ) from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    # -- admin helpers --------------------------------------------------------

    def admin_call(self, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"content-type": "application/json"}
        if self.credentials is not None:
            headers["authorization"] = "Bearer " + ":".join(self.credentials)
        request = urllib.request.Request(
            self.admin + path, data=data, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                raw = response.read()
                return response.status, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            with contextlib.suppress(ValueError):
                return exc.code, json.loads(raw)
            return exc.code, raw.decode(errors="replace")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        if self.credentials is not None:
            env["HALFMOON_ACCESS_KEY"], env["HALFMOON_SECRET_KEY"] = self.credentials
        return subprocess.run(
            [sys.executable, "-m", "halfmoon", *args, "--admin", self.admin],
            cwd=ROOT, capture_output=True, text=True, timeout=30, env=env,
        )  # fmt: skip

    def create_topic(self, name: str, message_type: str = "normal", queues: int = 4) -> None:
        code, body = self.admin_call(
            "POST",
            "/v1/topics",
            {"name": name, "message_type": message_type, "queue_count": queues, "perm": "rw"},
        )
        assert code in (200, 201), (code, body)

    def create_group(self, name: str, **fields: object) -> dict:
        """Create a consumer group (consume_from defaults to earliest: tests send first)."""
        body = {"name": name, "consume_from": "earliest", **fields}
        code, answer = self.admin_call("POST", "/v1/groups", body)
        assert code in (200, 201), (code, answer)
        return answer  # type: ignore[return-value]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the whole test module."""
    proc = ServerProcess(tmp_path_factory.mktemp("halfmoon-data")).start()
    try:
        yield proc
    finally:
        if proc.alive():
            proc.stop()


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start servers of one's own (restarts, kills); all stopped at the end."""
    started: list[ServerProcess] = []

    def make(**kwargs: object) -> ServerProcess:
        proc = ServerProcess(kwargs.pop("data_dir", tmp_path / "data"), **kwargs)  # type: ignore[arg-type]
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.kill()


_names = itertools.count()


def unique(prefix: str) -> str:
    """A name no earlier test or run used (topics and groups outlive a test on a shared
    server): a counter, and the milliseconds of the day."""
    return f"{prefix}-{next(_names)}-{int(time.time() * 1000) % 100000}"


def audit_denials(lines: list[str], seen: int = 0, containing: str = "") -> list[str]:
    """The ``event=access_denied`` lines after the first ``seen`` of ``lines`` (a server's
    output, read by a thread) that contain ``containing``; waits up to 10 s for one."""

    def found() -> list[str]:
        return [
            line for line in lines[seen:] if "event=access_denied" in line and containing in line
        ]

    wait_until(found, 10, f"an audit line (event=access_denied) containing {containing!r}")
    return found()
