"""The replication benchmark still runs end to end (tiny sizes; no timing asserts): an
unreplicated broker and groups of 1 and 2 replicas in etcd, each row measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cluster.etcd_server import etcd_binary

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_measures_every_target() -> None:
    etcd_binary()  # skips (fails under CI=true) without etcd
    proc = subprocess.run(
        [sys.executable, "-m", "bench.replication_bench",
         "--seconds", "0.2", "--threads", "2", "--batches", "4"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines()[2:]]
    assert [row[:2] for row in rows] == [["none", "4"], ["sync-1", "4"], ["sync-2", "4"]]
    for row in rows:
        assert float(row[2].replace(",", "")) > 0  # messages per second
    assert float(rows[1][5]) > 0 and float(rows[2][5]) > 0  # the replicas did work
