"""A broker process refuses to face a network without mutual TLS, unless told ``--insecure``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cluster.broker_processes import BrokerProcess

ROOT = Path(__file__).resolve().parents[2]


def test_a_broker_refuses_a_non_loopback_listener_without_mutual_tls(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "halfmoon", "broker", "--name", "exposed",
         "--data-dir", str(tmp_path / "data"), "--listen", "0.0.0.0:0"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "INSECURE_LISTEN" in done.stderr and "[internal]" in done.stderr, done.stderr
    assert not (tmp_path / "data").exists()  # refused before the store was opened


def test_insecure_says_it_is_meant(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", name="lab", extra=("--insecure",))
    broker.address = "0.0.0.0:0"
    broker.start()
    try:
        assert broker.address.endswith(tuple("0123456789"))
    finally:
        assert broker.stop() == 0
