"""``process_started_ms``: this process's start on the wall clock, from the kernel."""

from __future__ import annotations

import subprocess
import sys
import time

from halfmoon.process_start import process_started_ms


def test_a_process_started_later_says_so() -> None:
    before_ms = time.time() * 1000
    started = subprocess.run(
        [sys.executable, "-c", "from halfmoon.process_start import *; print(process_started_ms())"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    child_ms = int(started.stdout)
    # /proc's boot time is whole seconds: the start may read up to a second early.
    assert before_ms - 1000 <= child_ms <= time.time() * 1000
    assert process_started_ms() < child_ms
    assert process_started_ms() == process_started_ms()  # read once
