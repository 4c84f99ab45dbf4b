"""The peer-suite harness itself: outcomes, deselection, the verdict, sources, the TLS front."""

from __future__ import annotations

import asyncio
import importlib
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.peers import known_gaps, sources
from tests.peers.runner import RETRIES, RunResult, compare, merge_retry, run_suite
from tests.peers.tls_terminator import tls_terminator

ROOT = Path(__file__).resolve().parents[2]

FAKE_SUITE = """
import pytest

def test_passes():
    pass

def test_fails():
    assert False

def test_skips():
    pytest.skip("no")

@pytest.fixture
def broken():
    raise RuntimeError("setup")

def test_setup_error(broken):
    pass

@pytest.fixture
def bad_teardown():
    yield
    raise RuntimeError("teardown")

def test_teardown_error(bad_teardown):
    pass

def test_known_gap():
    assert False
"""


def test_a_run_records_every_phase_and_deselects_the_known_gaps(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_fake.py").write_text(FAKE_SUITE)
    result = run_suite(
        Path(sys.executable), tmp_path, ["tests"], url="amqp://guest:guest@127.0.0.1:1/",
        deselect=["tests/test_fake.py::test_known_*"], timeout=120,
    )  # fmt: skip
    assert result.outcomes == {
        "tests/test_fake.py::test_passes": "passed",
        "tests/test_fake.py::test_fails": "failed",
        "tests/test_fake.py::test_skips": "skipped",
        "tests/test_fake.py::test_setup_error": "failed",
        "tests/test_fake.py::test_teardown_error": "failed",
    }, result.output
    assert result.reasons["tests/test_fake.py::test_fails"] == "call: assert False"
    assert "RuntimeError: setup" in result.reasons["tests/test_fake.py::test_setup_error"]
    assert "RuntimeError: teardown" in result.reasons["tests/test_fake.py::test_teardown_error"]


def _run(**outcomes: str) -> RunResult:
    return RunResult(outcomes, 0, "")


@pytest.mark.parametrize(
    ("reference", "candidate", "gaps", "missing", "excused"),
    [
        # what RabbitMQ passes is required; what it fails or skips is not
        ({"a": "passed", "b": "failed", "c": "skipped"}, {"a": "passed"}, [], [], []),
        # a required test halfmoon failed, skipped or never ran is missing
        ({"a": "passed", "b": "passed", "c": "passed"},
         {"a": "failed", "b": "skipped"}, [], ["a", "b", "c"], []),
        # a known gap excuses it, by pattern
        ({"x1": "passed", "x2": "passed", "y": "passed"},
         {"y": "passed"}, ["x*"], [], ["x1", "x2"]),
    ],
)  # fmt: skip
def test_the_verdict_requires_what_the_reference_passes_less_the_known_gaps(
    reference: dict[str, str], candidate: dict[str, str], gaps: list[str],
    missing: list[str], excused: list[str],
) -> None:  # fmt: skip
    verdict = compare(_run(**reference), _run(**candidate), gaps)
    assert verdict.missing == missing
    assert verdict.gaps == excused
    assert verdict.summary()


def test_a_retry_can_only_turn_a_failure_into_a_pass() -> None:
    merged = merge_retry(_run(a="failed", b="passed", c="failed"), _run(a="passed", c="failed"))
    assert merged.outcomes == {"a": "passed", "b": "passed", "c": "failed"}


def test_every_known_gap_is_documented_with_its_reason() -> None:
    doc = (ROOT / "docs" / "amqp.md").read_text()
    for suite, gaps in known_gaps.GAPS.items():
        for gap in gaps:
            assert gap.why, (suite, gap.pattern)
            assert f"`{gap.pattern}`" in doc, f"{suite} gap {gap.pattern} is not in docs/amqp.md"


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
        env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
             "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"},
    ).stdout.strip()  # fmt: skip


def test_a_suite_comes_from_the_mirror_at_its_pinned_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = tmp_path / "upstream"
    (upstream / "tests").mkdir(parents=True)
    (upstream / "tests" / "test_x.py").write_text("pinned\n")
    _git("init", "-q", cwd=upstream)
    _git("add", ".", cwd=upstream)
    _git("commit", "-qm", "pinned", cwd=upstream)
    pinned = _git("rev-parse", "HEAD", cwd=upstream)
    (upstream / "tests" / "test_x.py").write_text("later\n")
    _git("commit", "-qam", "later", cwd=upstream)
    mirror = tmp_path / "mirror" / "owner+name"
    mirror.mkdir(parents=True)
    _git("clone", "-q", "--bare", str(upstream), str(mirror / "repo"), cwd=tmp_path)
    monkeypatch.setenv(sources.MIRROR_ENV, str(tmp_path / "mirror"))
    monkeypatch.setattr(sources, "WORK", tmp_path / "work")
    suite = sources.Suite("name", "1.0", "owner/name", pinned, sdist_url="", sdist_sha256="")
    assert (sources.fetch(suite) / "tests" / "test_x.py").read_text() == "pinned\n"

    elsewhere = sources.Suite("other", "1.0", "owner/other", "", sdist_url="", sdist_sha256="")
    with pytest.raises(sources.SuiteUnavailable, match="no mirror of owner/other"):
        sources.fetch(elsewhere)


def test_the_tls_front_relays_both_ways(tmp_path: Path) -> None:
    echo = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = echo.accept()
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data.upper())

    threading.Thread(target=serve, daemon=True).start()

    async def talk(port: int) -> bytes:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        writer.write(b"amqp")
        await writer.drain()
        answer = await asyncio.wait_for(reader.readexactly(4), 10)
        writer.close()
        return answer

    with tls_terminator(tmp_path / "front", echo.getsockname()) as port:
        assert asyncio.run(talk(port)) == b"AMQP"
    echo.close()


def test_a_run_stopped_at_its_deadline_keeps_what_it_ran(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_hangs.py").write_text(
        "import time\n\ndef test_first():\n    pass\n\ndef test_hangs():\n    time.sleep(600)\n"
    )
    result = run_suite(
        Path(sys.executable), tmp_path, ["tests"], url="amqp://guest:guest@127.0.0.1:1/",
        timeout=15,
    )  # fmt: skip
    assert result.outcomes == {"tests/test_hangs.py::test_first": "passed"}
    assert "deadline" in result.output


@pytest.mark.parametrize("module", ["test_aio_pika_suite", "test_aiormq_suite", "test_pika_suite"])
def test_a_suite_test_is_given_the_time_its_runs_may_take(module: str) -> None:
    """The project's default pytest timeout (600 s) is shorter than a suite's runs together
    (aio-pika's: about 15 minutes a server): each suite test carries its own, at least a
    reference run and a judged run with its retries."""
    loaded = importlib.import_module(f"tests.peers.{module}")
    marks = [m for m in loaded.pytestmark if m.name == "timeout"]
    assert len(marks) == 1, marks
    assert marks[0].args[0] >= (2 + RETRIES) * loaded.RUN_TIMEOUT
