"""The wheel: built from this tree, installed outside it, it serves with its dashboard.

``pip wheel`` builds it as ``python -m build`` would (PEP 517, an isolated build
environment). It is installed without its dependencies into a new virtual
environment, which borrows them from this one on ``PYTHONPATH`` (an editable
install of the checkout is a ``.pth`` hook, which ``PYTHONPATH`` does not run), and
run from a directory outside the checkout: what it serves comes from the wheel.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import urllib.request
import venv
import zipfile
from pathlib import Path

import pytest

from tests.server.conftest import ROOT, ServerProcess


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "deprecat" not in result.stderr.lower(), result.stderr[-3000:]
    (built,) = out.glob("halfmoon-*.whl")
    return built


def test_the_wheel_carries_the_dashboard_and_the_extras(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
    assert {"halfmoon/server/dashboard/index.html", "halfmoon/server/dashboard/dashboard.js"} <= (
        names
    )
    assert not any(name.startswith(("tests/", "bench/")) for name in names)
    extras = set(re.findall(r"^Provides-Extra: (\S+)$", text, flags=re.M))
    assert {"db", "spark", "amqp"} <= extras
    assert "License-Expression: Apache-2.0" in text


def test_the_installed_wheel_serves_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HALFMOON_")}
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]  # the dependencies, not halfmoon
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    where = subprocess.run(
        [str(python), "-c", "import halfmoon.server.app as m; print(m.__file__)"],
        cwd=outside, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(str(env_dir)), where.stdout
    version = subprocess.run(
        [str(env_dir / "bin" / "halfmoon"), "--version"], cwd=outside, env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert version.stdout.strip() == f"halfmoon {wheel.name.split('-')[1]}"
    server = WheelServer(env_dir / "bin" / "halfmoon", tmp_path / "data")
    server.env["PYTHONPATH"] = env["PYTHONPATH"]
    server.start()
    try:
        with urllib.request.urlopen(f"{server.admin}/", timeout=10) as page:
            assert page.url.endswith("/dashboard/")
            assert "<html" in page.read().decode().lower()
    finally:
        server.stop()


class WheelServer(ServerProcess):
    """The test server's command line, run by the wheel's ``halfmoon`` script."""

    def __init__(self, script: Path, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.script = script

    def command(self) -> list[str]:
        cmd = super().command()
        assert cmd[:3] == [sys.executable, "-m", "halfmoon"]
        return [str(self.script), *cmd[3:]]
