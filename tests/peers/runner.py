"""Run a client's own suite against one server and compare two servers' outcomes.

A run is ``pytest`` in the suites' environment (``sources.venv_python``), in
the suite's source tree, with the plugin in ``plugin/`` loaded: it points the
suite at ``AMQP_URL`` and writes every test's outcome to a JSON file. The
verdict the harness asserts: every test the reference server (RabbitMQ)
passes, the server under test (halfmoon) passes too, except the known gaps.
A test halfmoon fails is run again (up to :data:`RETRIES` times) before it
counts: these suites have their own timing races, and a loaded machine must
not fail halfmoon's run.
"""

from __future__ import annotations

import fnmatch
import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.peers.sources import PLUGIN_DIR

RETRIES = 2
PLUGIN = "halfmoon_peer_fixtures"


@dataclass
class RunResult:
    outcomes: dict[str, str]  # test id -> passed / failed / skipped
    returncode: int
    output: str  # the tail of pytest's output
    reasons: dict[str, str] = field(default_factory=dict)  # test id -> why it failed

    def with_id(self, outcome: str) -> list[str]:
        return sorted(t for t, o in self.outcomes.items() if o == outcome)


def run_suite(
    python: Path,
    suite_dir: Path,
    args: Sequence[str],
    *,
    url: str,
    tls_port: int | None = None,
    deselect: Sequence[str] = (),
    timeout: float,
    wrap: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> RunResult:
    """``pytest ARGS`` for one suite against the server at ``url``.

    ``wrap`` prefixes the command (a network namespace of its own for pika's suite).
    """
    with tempfile.TemporaryDirectory() as scratch:
        outcomes_path = Path(scratch) / "outcomes.json"
        deselect_path = Path(scratch) / "deselect.txt"
        deselect_path.write_text("".join(f"{p}\n" for p in deselect))
        run_env = dict(
            os.environ,
            **(env or {}),
            AMQP_URL=url,
            HALFMOON_PEER_OUTCOMES=str(outcomes_path),
            HALFMOON_PEER_DESELECT=str(deselect_path),
            PYTHONPATH=os.pathsep.join([str(PLUGIN_DIR), str(suite_dir)]),
            PYTHONDONTWRITEBYTECODE="1",
        )
        run_env.pop("PYTEST_ADDOPTS", None)
        run_env.pop("PYTEST_CURRENT_TEST", None)
        if tls_port is not None:
            run_env["AMQPS_PORT"] = str(tls_port)
        command = [
            *wrap, str(python), "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider",
            "-q", "--no-header", "-rN", *args,
        ]  # fmt: skip
        log_path = Path(scratch) / "output.txt"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                command, cwd=suite_dir, env=run_env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            try:
                returncode = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                # Past the deadline the run stops where it is: what it ran counts, the
                # rest is not passed. The whole process group goes (a wrapped server too).
                os.killpg(proc.pid, signal.SIGKILL)
                returncode = proc.wait()
                log.write(f"\n[stopped at the {timeout:.0f} s deadline]\n")
        output = log_path.read_text(errors="replace")[-4000:]
        outcomes: dict[str, str] = {}
        reasons: dict[str, str] = {}
        if outcomes_path.exists():
            for line in outcomes_path.read_text().splitlines():
                test, outcome, reason = json.loads(line)
                outcomes[test] = outcome
                if reason:
                    reasons[test] = reason
        if not outcomes:
            raise AssertionError(f"the suite ran no test ({returncode}):\n{output}")
    return RunResult(outcomes, returncode, output, reasons)


def matches(test_id: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(test_id, p) for p in patterns)


@dataclass
class Verdict:
    required: list[str]  # what the reference passed, less the known gaps
    missing: list[str]  # required, and the candidate did not pass it
    gaps: list[str]  # what the reference passed and a known gap excuses
    reference_failed: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)  # the candidate's failures

    def summary(self) -> str:
        lines = [
            f"{len(self.required)} tests required (passed by the reference), "
            f"{len(self.gaps)} excused as known gaps, "
            f"{len(self.reference_failed)} failed by the reference itself",
        ]
        if self.missing:
            lines.append(f"{len(self.missing)} required tests not passed:")
            lines += [f"  {t}  ({self.reasons.get(t, 'not run')})" for t in self.missing]
        return "\n".join(lines)


def compare(reference: RunResult, candidate: RunResult, gaps: Sequence[str]) -> Verdict:
    passed = reference.with_id("passed")
    required = [t for t in passed if not matches(t, gaps)]
    missing = [t for t in required if candidate.outcomes.get(t) != "passed"]
    return Verdict(
        required=required,
        missing=missing,
        gaps=[t for t in passed if matches(t, gaps)],
        reference_failed=reference.with_id("failed"),
        reasons=candidate.reasons,
    )


def outer_timeout(runs: int, run_timeout: float) -> pytest.MarkDecorator:
    """The pytest-timeout mark for a test that makes ``runs`` suite runs (a judge is
    ``1 + RETRIES``), each bounded by its own ``run_timeout``: never shorter than they may
    take together (the project's default of 600 s cut aio-pika's suite off mid-run)."""
    return pytest.mark.timeout(runs * run_timeout + 120)


def merge_retry(first: RunResult, retry: RunResult) -> RunResult:
    """A test that passed in either run passed (``retry`` ran only ``first``'s failures)."""
    outcomes = dict(first.outcomes)
    for test, outcome in retry.outcomes.items():
        if outcome == "passed":
            outcomes[test] = "passed"
    reasons = {
        t: r for t, r in {**first.reasons, **retry.reasons}.items() if outcomes[t] != "passed"
    }
    return RunResult(outcomes, retry.returncode, retry.output, reasons)


def judge(
    python: Path,
    suite_dir: Path,
    args: Sequence[str],
    reference: RunResult,
    *,
    url: str,
    gaps: Sequence[str],
    tls_port: int | None = None,
    left_out: Sequence[str] = (),
    retry_args: Sequence[str] = ("--timeout", "30"),
    timeout: float,
) -> Verdict:
    """Run ``args`` against the server at ``url`` (less ``gaps`` and ``left_out``), retry what
    it failed of what ``reference`` passed, and assert nothing required is missing."""
    candidate = run_suite(
        python, suite_dir, args, url=url, tls_port=tls_port, deselect=[*gaps, *left_out],
        timeout=timeout,
    )  # fmt: skip
    verdict = compare(reference, candidate, gaps)
    for _ in range(RETRIES):
        if not verdict.missing:
            break
        retry = run_suite(
            python, suite_dir, [*verdict.missing, *retry_args], url=url, tls_port=tls_port,
            timeout=timeout,
        )  # fmt: skip
        candidate = merge_retry(candidate, retry)
        verdict = compare(reference, candidate, gaps)
    assert not verdict.missing, verdict.summary() + "\n" + candidate.output
    return verdict
