"""``./run``'s setup: ``serve`` installs the broker's dependencies, ``test`` the dev extra.

The script runs in a copy of the repository's ``run`` and ``pyproject.toml``
whose ``.venv`` holds stubs: ``pip`` records its arguments, the other tools
only say they ran. So each case checks what would be installed, and when,
without touching the network or the real virtual environment.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.server.conftest import ROOT

STUB = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$(dirname "$0")/../calls.log"
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "run", tmp_path / "run")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("python", "pip", "halfmoon", "ruff", "mypy"):
        path = bin_dir / tool
        path.write_text(STUB)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return tmp_path


def run(repo: Path, *args: str, env: dict[str, str] | None = None) -> list[str]:
    """Run ``./run ARGS``; the pip installs it made."""
    log = repo / ".venv" / "calls.log"
    log.unlink(missing_ok=True)
    result = subprocess.run(
        ["bash", "./run", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=30,
        env=None if env is None else {**os.environ, **env},
    )
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    assert any(not c.startswith("pip ") for c in calls), "the command itself did not run"
    return [c for c in calls if c.startswith("pip install") and "--upgrade pip" not in c]


def test_serve_installs_the_broker_only_and_test_then_adds_the_dev_extra(repo: Path) -> None:
    assert run(repo, "serve") == ["pip install --quiet -e ."]
    assert run(repo, "serve") == []  # a re-run installs nothing
    assert run(repo, "bench") == []  # the store benchmark needs no more
    assert run(repo, "test") == ["pip install --quiet -e .[dev]"]
    assert run(repo, "test") == []
    # The full set satisfies serve: nothing reinstalled, so nothing uninstalled either.
    assert run(repo, "serve") == []


def test_test_on_a_fresh_venv_installs_the_dev_extra_once(repo: Path) -> None:
    assert run(repo, "test") == ["pip install --quiet -e .[dev]"]
    assert run(repo, "serve") == []


def test_a_changed_pyproject_installs_again(repo: Path) -> None:
    run(repo, "test")
    with (repo / "pyproject.toml").open("a") as f:
        f.write("\n# a new dependency\n")
    assert run(repo, "serve") == ["pip install --quiet -e ."]
    assert run(repo, "test") == ["pip install --quiet -e .[dev]"]


def test_a_venv_stamped_by_the_older_script_counts_as_the_full_set(repo: Path) -> None:
    digest = subprocess.run(
        ["sha1sum", "pyproject.toml"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout[:12]
    (repo / ".venv" / f".installed-{digest}").touch()
    assert run(repo, "serve") == []
    assert run(repo, "test") == []


def test_test_checks_types_after_ruff_and_before_pytest(repo: Path) -> None:
    run(repo, "test", "-q")
    calls = (repo / ".venv" / "calls.log").read_text().splitlines()
    tools = [c.split()[0] for c in calls if not c.startswith("pip ")]
    assert tools == ["ruff", "ruff", "mypy", "python", "python"]
    assert "mypy " in calls  # no arguments: pyproject.toml says what and how strictly
    # The tree's bytecode is written before pytest, whatever PYTHONDONTWRITEBYTECODE says.
    assert calls[-2] == "python -m compileall -q -j 0 halfmoon tests bench examples"
    assert calls[-1].startswith("python -m pytest ")


def test_peer_installs_the_dev_extra_and_runs_the_peer_suites(repo: Path) -> None:
    assert run(repo, "peer") == ["pip install --quiet -e .[dev]"]
    calls = (repo / ".venv" / "calls.log").read_text()
    assert "python -m pytest tests/peers" in calls
    assert "tests/server/test_*official*.py" in calls or "test_official" in calls


def test_test_spreads_pytest_over_three_workers_unless_told_otherwise(repo: Path) -> None:
    def pytest_call(env: dict[str, str] | None = None) -> str:
        run(repo, "test", "-q", "tests/x.py", env=env)
        calls = (repo / ".venv" / "calls.log").read_text().splitlines()
        return calls[-1]

    assert pytest_call() == "python -m pytest -n 3 -q tests/x.py"
    assert pytest_call({"HALFMOON_TEST_WORKERS": "0"}) == "python -m pytest -n 0 -q tests/x.py"


def test_install_adds_one_extra_and_refuses_one_it_does_not_know(repo: Path) -> None:
    log = repo / ".venv" / "calls.log"
    for extra in ("db", "spark", "amqp"):  # docs/spark.md's `./run install spark` among them
        log.unlink(missing_ok=True)
        done = subprocess.run(
            ["bash", "./run", "install", extra],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        assert f"pip install --quiet -e .[{extra}]" in log.read_text().splitlines()
    refused = subprocess.run(
        ["bash", "./run", "install", "pyspark"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 2 and "usage: ./run install db|spark|amqp" in refused.stderr
