"""Every Python block in docs/*.md runs, as the README's do (tests/test_readme.py).

A block that starts with an import is a program; a block that does not
continues the program before it (docs/spark.md's session, its stream, its
sink), so a reader can paste them in order. Each program runs in its own
interpreter in a fresh directory, against a real ``halfmoon serve``
(``127.0.0.1:8081`` and ``:8082`` are replaced by the test server's
addresses) and the local RabbitMQ where it names one. It must exit 0, and a
``print(...)  # TEXT`` line must print TEXT (up to a colon): the comment is
the expected output.

A block that cannot run carries ``<!-- not runnable: REASON -->`` on the line
before it. The only reason accepted is ``excerpt of MODULE``: every class and
field the block shows must exist in MODULE, so the excerpt stays true.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.server.conftest import ROOT, ServerProcess

DOCS = sorted((ROOT / "docs").glob("*.md"))
AMQP_URL = os.environ.get("HALFMOON_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
IN_CI = os.environ.get("CI", "").lower() == "true"
BLOCK = re.compile(
    r"(?:<!-- not runnable: (?P<reason>[^>]*?) -->\n)?```python\n(?P<code>.*?)```", re.S
)
EXPECTED_PRINT = re.compile(r"^\s*print\(.*\)[ \t]*#[ \t]*(?P<text>[^:\n]+)", re.M)


@dataclass
class Program:
    doc: str
    index: int
    code: str

    @property
    def id(self) -> str:
        return f"{self.doc}-{self.index}"


def _starts_a_program(code: str) -> bool:
    first = next(line for line in code.splitlines() if line.strip() and not line.startswith("#"))
    return first.startswith(("from ", "import "))


def programs() -> list[Program]:
    found: list[Program] = []
    for doc in DOCS:
        count = 0
        for match in BLOCK.finditer(doc.read_text()):
            if match.group("reason") is not None:
                continue  # checked by test_not_runnable_blocks_are_true_excerpts
            code = match.group("code")
            if _starts_a_program(code) or not found or found[-1].doc != doc.name:
                found.append(Program(doc.name, count, code))
                count += 1
            else:
                found[-1].code += "\n" + code
    return found


def excerpts() -> list[tuple[str, str, str]]:
    return [
        (doc.name, m.group("reason"), m.group("code"))
        for doc in DOCS
        for m in BLOCK.finditer(doc.read_text())
        if m.group("reason") is not None
    ]


PROGRAMS = programs()


def test_every_doc_with_python_has_programs() -> None:
    with_python = {d.name for d in DOCS if "```python" in d.read_text()}
    assert with_python == {p.doc for p in PROGRAMS} | {e[0] for e in excerpts()}
    assert {"toolkit.md", "spark.md"} <= {p.doc for p in PROGRAMS}
    # Marks stay rare: each one is a block nobody runs.
    assert len(excerpts()) <= 2


@pytest.mark.parametrize(("doc", "reason", "code"), excerpts(), ids=lambda v: str(v)[:24])
def test_not_runnable_blocks_are_true_excerpts(doc: str, reason: str, code: str) -> None:
    match = re.fullmatch(r"excerpt of ([\w.]+)", reason)
    assert match, f"{doc}: '{reason}' is not an accepted reason (only 'excerpt of MODULE')"
    module = importlib.import_module(match.group(1))
    for name, body in re.findall(r"^class (\w+)\b.*?:\n((?:[ \t]+.*\n?)*)", code, re.M):
        cls = getattr(module, name, None)
        assert cls is not None, f"{doc}: {match.group(1)} has no class {name}"
        for member in re.findall(r"^\s+(\w+)\s*:", body, re.M):
            assert member in getattr(cls, "__annotations__", {}), f"{name}.{member} is gone"
        for method in re.findall(r"^\s+def (\w+)\(", body, re.M):
            assert hasattr(cls, method), f"{name}.{method} is gone"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    proc = ServerProcess(tmp_path_factory.mktemp("docs")).start()
    try:
        proc.create_topic("order-events", message_type="transaction")
        proc.create_topic("orders", queues=2)
        proc.create_topic("order-copies", message_type="transaction", queues=2)
        proc.create_topic("halfmoon-spark-commits", message_type="transaction", queues=1)
        yield proc
    finally:
        proc.stop()


def _require(program: Program) -> None:
    missing = None
    if "amqp://" in program.code:
        parts = urlsplit(AMQP_URL)
        try:
            socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), 3).close()
        except OSError as exc:
            missing = f"RabbitMQ at {AMQP_URL} is not reachable ({exc}; HALFMOON_TEST_AMQP)"
    if "halfmoon.spark" in program.code and shutil.which("java") is None:
        missing = "Spark needs Java 17 on the PATH"
    if missing:
        if IN_CI:
            pytest.fail(missing)
        pytest.skip(missing)


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.id for p in PROGRAMS])
def test_doc_program_runs(program: Program, server: ServerProcess, tmp_path: Path) -> None:
    _require(program)
    code = (
        program.code.replace("http://127.0.0.1:8082", server.admin)
        .replace("127.0.0.1:8081", server.grpc)
        .replace("amqp://guest:guest@127.0.0.1:5672/", AMQP_URL)
    )
    if "spark" in program.doc:
        _send_orders(server, 30)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYSPARK_PYTHON=sys.executable)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout.splitlines()
    for expected in EXPECTED_PRINT.findall(program.code):
        assert expected.strip() in printed, (expected, result.stdout[-2000:])
    if "spark" in program.doc:
        # The sink wrote each order once, committed: the copies are visible.
        status = server.admin_call("GET", "/v1/topics/order-copies/status")[1]
        assert sum(q["max_offset"] for q in status["queues"]) == 30, status


def _send_orders(server: ServerProcess, count: int) -> None:
    from halfmoon.client import Message, SyncProducer

    with SyncProducer(server.grpc) as producer:
        producer.send_batch(
            [Message("orders", f"order-{i}".encode(), tag="created") for i in range(count)]
        )
