"""The consume-transform-produce benchmark still runs end to end (tiny sizes; no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_ctp_bench_runs_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "ctp.json"
    cmd = [
        sys.executable, "-m", "bench.ctp_bench",
        "--messages", "120", "--workers", "2", "--rounds", "1", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "PASS" in done.stdout or "MISS" in done.stdout
    report = json.loads(out.read_text())
    scenarios = {r["scenario"]: r for r in report["results"]}
    assert set(scenarios) == {"plain", "tx1", "tx10", "tx100"}
    for r in scenarios.values():
        assert r["messages"] >= 120 and r["msgs_per_s"] > 0 and r["server_cpu_us_per_msg"] > 0
