"""HALFMOON_* variables are read in one place: halfmoon.environment (and the configuration)."""

from __future__ import annotations

import re
from pathlib import Path

from halfmoon import environment
from halfmoon.config import load_config

PACKAGE = Path(__file__).parent.parent / "halfmoon"
# The registry itself; the tests' failpoints; and three modules that set other programs'
# variables (Spark's Python, gRPC's C core verbosity and fork handlers) without reading any.
MAY_TOUCH_OS_ENVIRON = {
    "environment.py", "failpoints.py", "spark/session.py", "logs.py", "__init__.py",
}  # fmt: skip


def test_no_module_reads_the_environment_but_the_registry():
    readers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"os\.environ|os\.getenv|getenv\(", path.read_text(encoding="utf-8"))
    )
    assert set(readers) <= MAY_TOUCH_OS_ENVIRON, readers


def test_setenv_only_modules_read_no_halfmoon_variable():
    for name in ("spark/session.py", "logs.py"):
        text = (PACKAGE / name).read_text(encoding="utf-8")
        assert not re.search(r"os\.environ(\.get)?[\[(]\s*[\"']HALFMOON_", text), name


def test_an_empty_variable_counts_as_unset(monkeypatch):
    monkeypatch.setenv("HALFMOON_ADMIN", "")
    assert environment.ADMIN.get() is None
    monkeypatch.setenv("HALFMOON_ADMIN", "http://10.0.0.1:8082")
    assert environment.ADMIN.get() == "http://10.0.0.1:8082"
    assert environment.ADMIN.get({}) is None


def test_tool_variables_claim_no_configuration_key():
    # The loader refuses a HALFMOON_<SECTION>_... name that names no key; a tool variable
    # must not look like one (HALFMOON_CLUSTER and HALFMOON_COORDINATOR alias two keys).
    config = load_config(env={v.name: "x" for v in environment.TOOL_VARIABLES})
    assert (config.cluster.name, config.cluster.coordinator) == ("x", "x")
    assert len({v.name for v in environment.TOOL_VARIABLES}) == len(environment.TOOL_VARIABLES)
    assert all(v.name.startswith(environment.PREFIX) for v in environment.TOOL_VARIABLES)


def test_every_tool_variable_is_documented():
    doc = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    assert all(f"`{v.name}`" in doc for v in environment.TOOL_VARIABLES)
