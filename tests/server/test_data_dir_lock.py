"""One data directory, one ``halfmoon serve``: a second start is refused and touches nothing.

Real processes throughout. A server holds its data directory under sync flush
while a producer keeps sending; a second ``halfmoon serve`` on the same
directory, on other ports and on the very same ports, exits with
``DATA_DIR_LOCKED`` (exit status 3) naming the holder, changes no file (checked
with the holder SIGSTOPped, so nothing else moves), and leaves the holder
serving with its ``abort`` marker in place. After a SIGKILL of the holder the
lock is the kernel's to release: a new start succeeds at once, and recovery
finds every acknowledged message. A taken port fails a start before its store
is opened.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from halfmoon.client import Message, SyncProducer
from halfmoon.errors import EXIT_IN_USE
from tests.server.conftest import ROOT, ServerProcess, wait_until

SYNC = ("store.flush=sync",)
TOPIC = "locked-orders"


def _serve(data_dir: Path, grpc_port: int, admin_port: int) -> subprocess.CompletedProcess[str]:
    """A second ``halfmoon serve`` run to its end: refused starts exit at once."""
    return subprocess.run(
        [
            sys.executable, "-m", "halfmoon", "serve", "--data-dir", str(data_dir),
            "--listen", f"127.0.0.1:{grpc_port}", "--admin-listen", f"127.0.0.1:{admin_port}",
            "--set", "store.flush=sync", "--set", "store.segment_size=16MiB",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _files(data_dir: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under ``data_dir``: (size, mtime ns, inode), enough to see any write,
    truncation, replacement, removal or creation."""
    found: dict[str, tuple[int, int, int]] = {}
    for path in data_dir.rglob("*"):
        stat = path.stat()
        found[str(path.relative_to(data_dir))] = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
    return found


class Sender(threading.Thread):
    """Sends one message after another until stopped; keeps the id of every one acknowledged."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.acknowledged: list[str] = []
        self.failures: list[BaseException] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        with SyncProducer(self.address) as producer:
            n = 0
            while not self._stopping.is_set():
                try:
                    receipt = producer.send(Message(TOPIC, f"m{n}".encode()), timeout=10)
                except Exception as exc:  # noqa: BLE001 - after the SIGKILL: expected
                    self.failures.append(exc)
                    return
                self.acknowledged.append(receipt.message_id)
                n += 1

    def stop(self) -> None:
        self._stopping.set()
        self.join(30)


def _stored(server: ServerProcess, message_id: str) -> bool:
    code, body = server.admin_call("GET", f"/v1/messages/{message_id}?topic={TOPIC}")
    return code == 200 and isinstance(body, dict) and len(body["messages"]) == 1


def _refused(result: subprocess.CompletedProcess[str], holder_pid: int) -> None:
    assert result.returncode == EXIT_IN_USE == 3, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("halfmoon: error: data directory"), result.stderr
    assert f"in use by process {holder_pid}" in last and "(DATA_DIR_LOCKED)" in last, last
    assert "halfmoon serve" in last, last


@pytest.mark.slow
def test_a_second_serve_is_refused_and_the_first_loses_nothing(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    first = server_factory(data_dir=data_dir, settings=SYNC).start()
    assert first.proc is not None
    holder = json.loads((data_dir / "lock").read_text())
    assert holder["pid"] == first.proc.pid and holder["command"] == "halfmoon serve"
    first.create_topic(TOPIC, queues=2)
    sender = Sender(first.grpc)
    sender.start()
    wait_until(lambda: len(sender.acknowledged) >= 20, 30, "sends acknowledged under sync flush")

    # Paused, the holder writes nothing: any change below is the second start's doing.
    os.kill(first.proc.pid, signal.SIGSTOP)
    try:
        before = _files(data_dir)
        assert "abort" in before  # the holder's crash marker
        _refused(_serve(data_dir, 0, 0), first.proc.pid)
        _refused(_serve(data_dir, first.grpc_port, first.admin_port), first.proc.pid)
        assert _files(data_dir) == before
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)

    served = len(sender.acknowledged)
    wait_until(lambda: len(sender.acknowledged) >= served + 20, 30, "the holder serving on")
    assert first.alive() and (data_dir / "abort").exists()
    assert not sender.failures, sender.failures

    first.kill()  # SIGKILL under load: a crash, the marker says so to recovery
    sender.stop()
    acknowledged = list(sender.acknowledged)
    assert (data_dir / "abort").exists()
    again = server_factory(data_dir=data_dir, settings=SYNC).start()  # no stale lock to wait on
    assert again.proc is not None
    assert json.loads((data_dir / "lock").read_text())["pid"] == again.proc.pid
    missing = [m for m in acknowledged if not _stored(again, m)]
    assert not missing, f"{len(missing)} of {len(acknowledged)} acknowledged messages lost"


def test_the_lock_is_released_when_its_holder_is_killed(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    first = server_factory(data_dir=data_dir).start()
    assert first.proc is not None
    _refused(_serve(data_dir, 0, 0), first.proc.pid)
    first.kill()
    again = server_factory(data_dir=data_dir).start()
    assert again.proc is not None and again.alive()
    _refused(_serve(data_dir, 0, 0), again.proc.pid)
    assert again.stop() == 0
    # Stopped cleanly, it let go too: the next start is not refused.
    third = server_factory(data_dir=data_dir).start()
    assert third.alive()


def test_a_taken_port_fails_before_the_store_is_opened(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    first = server_factory(data_dir=tmp_path / "first").start()
    other = tmp_path / "other"
    for grpc_port, admin_port in (
        (first.grpc_port, 0),
        (0, first.admin_port),
    ):
        result = _serve(other, grpc_port, admin_port)
        assert result.returncode == 1, result.stderr
        assert "in use" in result.stderr and "(UNAVAILABLE)" in result.stderr, result.stderr
        # Its own lock, nothing else: no commit log, no marker, no metadata, no users.
        assert sorted(p.name for p in other.iterdir()) == ["lock"]
    assert first.alive()
