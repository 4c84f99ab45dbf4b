"""The test-only failpoints: inert unless armed, and when armed they stop or kill a real process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import halfmoon
from halfmoon import failpoints
from tests.waiting import wait_until

HIT = "import sys; from halfmoon import failpoints; getattr(failpoints, sys.argv[1])(sys.argv[2])"


def _hit(function: str, point: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", HIT, function, point],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("function", ["store", "spark_sink", "amqp", "txn_group"])
def test_an_unarmed_point_returns(function: str, monkeypatch: pytest.MonkeyPatch) -> None:
    envs = (failpoints.STORE_ENV, failpoints.SPARK_SINK_ENV, failpoints.AMQP_ENV)
    for env in (*envs, failpoints.TXN_GROUP_ENV):
        monkeypatch.delenv(env, raising=False)
    assert getattr(failpoints, function)("truncate-after-log") is None


def test_a_point_armed_for_another_step_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(failpoints.STORE_ENV, f"truncate-before-clear={tmp_path / 'reached'}")
    failpoints.store("truncate-after-log")
    assert not (tmp_path / "reached").exists()


@pytest.mark.parametrize(
    ("function", "env"),
    [
        ("store", failpoints.STORE_ENV),
        ("spark_sink", failpoints.SPARK_SINK_ENV),
        ("amqp", failpoints.AMQP_ENV),
    ],
)
def test_an_armed_point_reports_its_pid_and_waits_to_be_killed(
    function: str, env: str, tmp_path: Path
) -> None:
    reached = tmp_path / "reached"
    child = _hit(function, "before-marker", {env: f"before-marker={reached}"})
    try:
        wait_until(lambda: reached.exists() and reached.read_text(), 60, "the failpoint")
        assert int(reached.read_text()) == child.pid
        assert child.poll() is None  # it waits there for the test
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_an_armed_transaction_group_point_kills_the_process() -> None:
    child = _hit(
        "txn_group",
        "participant-after-apply",
        {failpoints.TXN_GROUP_ENV: "participant-after-apply"},
    )
    assert child.wait(timeout=60) == -signal.SIGKILL


def test_the_variables_keep_their_names() -> None:
    assert failpoints.STORE_ENV == "HALFMOON_STORE_FAILPOINT"
    assert failpoints.TXN_GROUP_ENV == "HALFMOON_TEST_TXN_CRASH_AT"
    assert failpoints.SPARK_SINK_ENV == "HALFMOON_SPARK_SINK_FAILPOINT"


def test_the_points_are_armed_in_this_module_only() -> None:
    """Production modules call a point by name; none holds a second name for a variable
    (a test then reads it from one place) or reads a failpoint variable itself."""
    root = Path(next(iter(halfmoon.__path__)))
    names = {failpoints.STORE_ENV, failpoints.SPARK_SINK_ENV, failpoints.TXN_GROUP_ENV}
    elsewhere = {}
    for path in sorted(root.rglob("*.py")):
        if path.name == "failpoints.py" and path.parent == root:
            continue
        code = path.read_text()
        found = re.findall(r"failpoints\.[A-Z_]+\b", code) + [
            n for n in names if f'"{n}"' in code or f"'{n}'" in code
        ]
        if found:
            elsewhere[str(path.relative_to(root.parent))] = found
    assert elsewhere == {}
