"""The garbage collector's settings (halfmoon/gc_tuning.py), in real processes: a served
process applies them once ready, and turning them off leaves CPython's own."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from halfmoon.config import ConfigError
from halfmoon.gc_tuning import tune_collector
from tests.server.conftest import ServerProcess

PROBE = (
    "import gc, sys; from halfmoon.gc_tuning import tune_collector; "
    "tune_collector(sys.argv[1] == 'freeze', int(sys.argv[2])); "
    "print(*gc.get_threshold(), gc.get_freeze_count())"
)


def probe(freeze: bool, young: int) -> list[int]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "freeze" if freeze else "no", str(young)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [int(field) for field in done.stdout.split()]


def test_the_settings_change_the_collector_and_zero_leaves_cpythons_own() -> None:
    young, middle, old, frozen = probe(True, 50_000)
    assert (young, middle, old) == (50_000, 10, 10) and frozen > 1_000
    assert probe(False, 0) == [700, 10, 10, 0]


def test_a_negative_threshold_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match="gc_young_threshold"):
        tune_collector(False, -1)


def tuned_line(server: ServerProcess) -> str:
    (line,) = [line for line in server.lines if "event=gc_tuned" in line]
    return line


def test_a_served_process_is_tuned_once_ready_unless_told_not_to(
    server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    tuned = tuned_line(server_factory(data_dir=tmp_path / "tuned").start())
    match = re.search(r"frozen_objects=(\d+) thresholds=(\d+)/", tuned)
    assert match is not None and int(match[1]) > 10_000 and match[2] == "50000", tuned
    untuned = tuned_line(
        server_factory(
            data_dir=tmp_path / "untuned",
            settings=("server.gc_freeze=false", "server.gc_young_threshold=0"),
        ).start()
    )
    assert "frozen_objects=0 thresholds=700/10/10" in untuned, untuned
