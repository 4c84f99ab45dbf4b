"""The receive + ack benchmark still runs end to end (a few messages; no timing asserts)."""

from __future__ import annotations

import subprocess
import sys

from tests.server.conftest import ROOT


def test_the_serve_mode_consumes_every_message_and_reports_cpu() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench.pop_ack_bench", "--mode", "serve", "--messages", "60"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "60 messages, 4 consumers" in run.stdout and "server CPU" in run.stdout, run.stdout
