"""One data directory, one ``halfmoon broker``: standalone and as every member of a group.

Real processes: a broker holds its data directory; a second ``halfmoon
broker`` (or ``halfmoon serve``) on it exits with ``DATA_DIR_LOCKED`` (exit
status 3) naming the holder and changes no file; after a SIGKILL of the
holder a new broker starts on the directory at once. In a group, the master
and the replica each hold their own directory; a second member process on
either is refused before it campaigns, and the group keeps its master.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from halfmoon.errors import EXIT_IN_USE
from tests.cluster.broker_processes import BrokerProcess
from tests.cluster.etcd_server import EtcdServer
from tests.replication.group_cluster import CLUSTER, GROUP, role

pytestmark = pytest.mark.slow


def _halfmoon(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HALFMOON_")}
    return subprocess.run(
        [sys.executable, "-m", "halfmoon", *args],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip


def _refused(result: subprocess.CompletedProcess[str], holder: BrokerProcess) -> None:
    assert result.returncode == EXIT_IN_USE, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert f"in use by process {holder.pid}" in last, last
    assert "halfmoon broker" in last and "(DATA_DIR_LOCKED)" in last, last


def _files(data_dir: Path) -> dict[str, tuple[int, int, int]]:
    return {
        str(p.relative_to(data_dir)): (p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ino)
        for p in data_dir.rglob("*")
    }


def test_a_second_broker_or_server_on_a_brokers_directory_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "b"
    first = BrokerProcess(data_dir).start()
    try:
        assert json.loads((data_dir / "lock").read_text())["pid"] == first.pid
        os.kill(first.pid, signal.SIGSTOP)  # nothing of its own moves while we look
        try:
            before = _files(data_dir)
            assert "abort" in before
            _refused(
                _halfmoon("broker", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0"),
                first,
            )
            _refused(
                _halfmoon("broker", "--data-dir", str(data_dir), "--listen", first.address),
                first,
            )
            _refused(
                _halfmoon(
                    "serve", "--data-dir", str(data_dir),
                    "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                ),
                first,
            )  # fmt: skip
            assert _files(data_dir) == before
        finally:
            os.kill(first.pid, signal.SIGCONT)
        first.kill()
        again = BrokerProcess(data_dir, address=first.address).start()  # at once: no stale lock
        assert json.loads((data_dir / "lock").read_text())["pid"] == again.pid
        assert again.stop() == 0
    finally:
        first.kill()


def test_every_member_of_a_group_holds_its_directory(tmp_path: Path) -> None:
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    flags = (
        "--cluster", CLUSTER, "--coordinator", etcd.url, "--lease-ttl", "2",
        "--group", GROUP, "--replication", "async", "--min-insync-replicas", "1",
        "--set", "store.segment_size=1048576",
    )  # fmt: skip
    master = BrokerProcess(tmp_path / "b0", name="b0", extra=flags)
    replica = BrokerProcess(tmp_path / "b1", name="b1", extra=flags)
    try:
        master.start()
        replica.start()
        assert role(master) == "master" and role(replica) == "replica"
        for holder, name in ((master, "b2"), (replica, "b3")):
            result = _halfmoon(
                "broker", "--name", name, "--data-dir", str(holder.data_dir),
                "--listen", "127.0.0.1:0", *flags,
            )  # fmt: skip
            _refused(result, holder)
        assert role(master) == "master" and role(replica) == "replica"
    finally:
        replica.kill()
        master.kill()
        etcd.stop()


def test_a_taken_port_fails_a_broker_before_its_store_is_opened(tmp_path: Path) -> None:
    holder = BrokerProcess(tmp_path / "holder").start()
    try:
        other = tmp_path / "other"
        result = _halfmoon("broker", "--data-dir", str(other), "--listen", holder.address)
        assert result.returncode == 1, result.stderr
        assert "(UNAVAILABLE)" in result.stderr.strip().splitlines()[-1], result.stderr
        # Its own lock, nothing else: no commit log, no marker, no metadata.
        assert sorted(p.name for p in other.iterdir()) == ["lock"]
        assert holder.process is not None and holder.process.poll() is None
    finally:
        holder.kill()
