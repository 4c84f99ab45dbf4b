"""The orders example's one command, on the embedded defaults (SQLite + a halfmoon serve it
starts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_orders_example_runs_in_one_command_and_reports_consistent() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "orders" / "demo.py"),
            "--orders",
            "14",
            "--timeout",
            "60",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert "CONSISTENT" in out and "INCONSISTENT" not in out and "FAIL" not in out
    assert "placed 14 orders: 12 committed, 2 rolled back" in out
    # Every kind of outcome happened: confirmed, cancelled (out of stock or declined), duplicates
    # absorbed.
    report = out[out.index("consistency report") :]
    assert "confirmed 0" not in report and "cancelled 0" not in report
    assert "duplicates absorbed by the inbox 0" not in report
