"""The internal-TLS benchmark still runs end to end (tiny sizes; no timing asserts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_measures_plaintext_and_mutual_tls() -> None:
    pytest.importorskip("cryptography")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.cluster_tls_bench",
         "--rounds", "1", "--seconds", "0.2", "--senders", "1", "--batch", "4"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()[2:]}
    assert set(rows) == {"plain", "mtls"}, proc.stdout
    assert all(float(row[1]) > 0 and float(row[4]) > 0 for row in rows.values()), proc.stdout
