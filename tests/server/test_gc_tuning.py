"""The startup heap frozen out of the garbage collector (halfmoon/gc_tuning.py), in real
processes: a served process freezes it once ready, unless told not to."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.server.conftest import ServerProcess

PROBE = (
    "import gc, sys; from halfmoon.gc_tuning import freeze_startup_heap; "
    "freeze_startup_heap(sys.argv[1] == 'on'); print(gc.get_freeze_count(), *gc.get_threshold())"
)


def frozen_and_thresholds(enabled: bool) -> list[int]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "on" if enabled else "off"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [int(field) for field in done.stdout.split()]


def test_freezing_moves_the_heap_out_of_reach_and_leaves_the_thresholds() -> None:
    frozen, *thresholds = frozen_and_thresholds(True)
    assert frozen > 1_000 and thresholds == [700, 10, 10]
    assert frozen_and_thresholds(False) == [0, 700, 10, 10]


def gc_line(server: ServerProcess) -> str:
    (line,) = [line for line in server.lines if "event=gc_" in line]
    return line


def test_a_served_process_freezes_its_startup_heap_once_ready_unless_told_not_to(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    frozen = gc_line(server_factory(data_dir=tmp_path / "frozen").start())
    match = re.search(r"event=gc_frozen objects=(\d+) ", frozen)
    assert match is not None and int(match[1]) > 10_000, frozen
    unfrozen = gc_line(
        server_factory(data_dir=tmp_path / "unfrozen", settings=("server.gc_freeze=false",)).start()
    )
    assert "event=gc_not_frozen" in unfrozen, unfrozen
