"""What a new user meets first: help, the version, waiting for a starting server, and a
missing optional extra reported as one line."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tests.cli.test_cli import ROOT, halfmoon, ok


def test_bare_halfmoon_prints_help() -> None:
    out = ok(halfmoon())
    assert out.startswith("usage: halfmoon")
    assert "serve" in out and "topic" in out


def test_version() -> None:
    out = ok(halfmoon("--version"))
    assert out.startswith("halfmoon ")
    assert out.split()[1][0].isdigit(), out


def _reserved_port() -> tuple[socket.socket, int]:
    # Bound, not listening: a connection is refused, as to a server not yet started.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock, sock.getsockname()[1]


def test_status_wait_gives_up_on_a_server_that_never_starts() -> None:
    sock, port = _reserved_port()
    with sock:
        started = time.monotonic()
        result = halfmoon("status", "--wait", "1s", "--admin", f"http://127.0.0.1:{port}")
        waited = time.monotonic() - started
    assert result.returncode == 1
    assert waited >= 1.0
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert "no server answered within 1 s" in lines[0] and lines[0].endswith("(UNAVAILABLE)")


def test_status_without_wait_fails_at_once() -> None:
    sock, port = _reserved_port()
    with sock:
        result = halfmoon("status", "--admin", f"http://127.0.0.1:{port}")
    assert result.returncode == 1
    assert "(UNAVAILABLE)" in result.stderr and "within" not in result.stderr


class _Status(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 — http.server's name
        body = json.dumps({"broker": "starting-late", "topics": 0}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def late_port() -> Iterator[int]:
    sock, port = _reserved_port()
    sock.close()
    yield port


def test_status_wait_answers_once_the_server_is_up(late_port: int) -> None:
    # The command starts first, against a port nobody listens on yet; the server after.
    command = subprocess.Popen(
        [sys.executable, "-m", "halfmoon", "status", "--wait", "60s", "--json",
         "--admin", f"http://127.0.0.1:{late_port}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    server = HTTPServer(("127.0.0.1", late_port), _Status)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        out, err = command.communicate(timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    assert command.returncode == 0, err
    assert json.loads(out)["broker"] == "starting-late"


BLOCKED = "import sys; sys.modules[{name!r}] = None; "


def _without(module: str, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKED.format(name=module) + code],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_cli_command_without_its_extra_says_which_and_how(tmp_path) -> None:
    db = tmp_path / "x.db"
    result = _without(
        "sqlalchemy",
        "from halfmoon.cli.main import main; "
        f"raise SystemExit(main(['outbox', 'status', '--db', 'sqlite:///{db}']))",
    )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr  # no traceback
    assert "'db' extra" in lines[0] and "./run install db" in lines[0]
    assert lines[0].endswith("(MISSING_EXTRA)")
    assert not db.exists()


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [("halfmoon.outbox", "sqlalchemy", "db"), ("halfmoon.spark", "pyarrow", "spark"),
     ("halfmoon.spark", "pyspark", "spark")],
)  # fmt: skip
def test_importing_without_the_extra_names_it(module: str, blocked: str, extra: str) -> None:
    result = _without(
        blocked,
        f"""
try:
    import {module}
except ImportError as exc:
    print(type(exc).__name__, exc)
""",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("MissingExtra ")
    assert blocked in result.stdout and f"'{extra}' extra" in result.stdout


def test_spark_command_names_the_missing_package_not_another() -> None:
    result = _without(
        "pyarrow",
        "from halfmoon.cli.main import main; raise SystemExit(main(['spark', 'stats', 'x']))",
    )
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "pyarrow not installed" in lines[0] and "pyspark" not in lines[0].split(":")[0]
