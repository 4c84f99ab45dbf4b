"""Run a benchmark module the way a user does, with its JSON report, for the smoke tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_bench(module: str, *args: str, json_path: Path, timeout: float) -> tuple[str, Any]:
    """``python -m module ARGS --json json_path`` from the repository root; asserts it
    exited 0 and returns what it printed and the report it wrote."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args, "--json", str(json_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(json_path.read_text())
