"""The collector benchmark still runs end to end (tiny sizes; no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.gc_bench import ROWS, VARIANTS

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_gc_bench_runs_and_reports_every_row_for_both_variants(tmp_path: Path) -> None:
    out = tmp_path / "gc.json"
    cmd = [
        sys.executable, "-m", "bench.gc_bench",
        "--messages", "2000", "--seconds", "0.4", "--rounds", "1", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "frozen/untouched server CPU per message" in done.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {(r["variant"], r["row"]) for r in rows} == {(v, r) for v in VARIANTS for r in ROWS}
    assert all(r["messages"] > 0 and r["server_cpu_us"] > 0 for r in rows), rows
