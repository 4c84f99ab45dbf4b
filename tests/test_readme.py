"""The README's commands and examples stay true: run them against a real server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.conftest import ServerProcess
from tests.test_layers import LAYERS

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
IN_CI = os.environ.get("CI", "").lower() == "true"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_readme_opens_with_the_serve_and_test_commands() -> None:
    first_block = re.search(r"```sh\n(.*?)```", README, flags=re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands[:2] == ["./run serve", "./run test"]
    run_script = (ROOT / "run").read_text()
    assert "serve)" in run_script and "test)" in run_script


def test_ci_runs_the_readme_test_command() -> None:
    assert "./run test" in (ROOT / ".ci" / "run").read_text()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    proc = ServerProcess(tmp_path_factory.mktemp("readme")).start()
    try:
        # The README's CLI lines, against this server's admin API.
        for line in (
            re.search(r"## Using it.*?```sh\n(.*?)```", README, flags=re.S).group(1).splitlines()
        ):
            if line.startswith(".venv/bin/halfmoon "):
                result = proc.cli(*line.split()[1:])
                assert result.returncode == 0, result.stderr
        yield proc
    finally:
        proc.stop()


@pytest.mark.parametrize(
    ("index", "expected"),
    [(0, "sent "), (1, "TransactionResolution.COMMIT")],
    ids=["producer", "transactional-producer"],
)
def test_readme_python_examples_run(server: ServerProcess, index: int, expected: str) -> None:
    blocks = python_blocks()
    assert len(blocks) == 3
    code = blocks[index].replace("127.0.0.1:8081", server.grpc)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=90, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert expected in result.stdout


def test_readme_consumer_example_receives(server: ServerProcess) -> None:
    blocks = python_blocks()
    # Something to consume: the producer example's message.
    subprocess.run(
        [sys.executable, "-c", blocks[0].replace("127.0.0.1:8081", server.grpc)],
        check=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    # The example listens for 5 s; give it longer on a busy machine and stop it
    # as soon as it has printed the message.
    code = blocks[2].replace("127.0.0.1:8081", server.grpc)
    assert "await asyncio.sleep(5)" in code
    code = code.replace("await asyncio.sleep(5)", "await asyncio.sleep(60)")
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        # Bounded: the process exits by itself after its 60 s listen.
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "orders created" in line:
                break
        assert any("orders created" in line for line in lines), "".join(lines)
    finally:
        proc.kill()
        proc.wait(10)


IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.mark.skipif(
    not IS_ROOT and not IN_CI, reason="needs root for a network namespace of its own"
)
def test_readme_shell_block_runs_as_pasted(tmp_path: Path) -> None:
    """The "Using it" block, pasted into a shell: `./run serve … &` and the commands after
    it, on the default ports. It runs in a network namespace of its own (loopback only),
    where 8081, 8082 and the AMQP port are free whatever else this machine runs; the
    data directory is a temporary one. Then the producer example sends to the topic the
    block created, at the README's own address."""
    block = re.search(r"## Using it.*?```sh\n(.*?)```", README, flags=re.S).group(1)
    assert block.startswith("./run serve --data-dir ./data &\n")
    assert ".venv/bin/halfmoon status --wait" in block  # no command races the start
    script = block.replace("./data", str(tmp_path / "data"))
    producer = python_blocks()[0]
    assert "127.0.0.1:8081" in producer
    (tmp_path / "producer.py").write_text(producer)
    program = "\n".join(
        [
            "set -e",
            "ip link set lo up",
            "trap 'kill %1 2>/dev/null; wait' EXIT",
            script,
            f".venv/bin/python {tmp_path / 'producer.py'}",
        ]
    )
    result = subprocess.run(
        ["unshare", "-n", "bash", "-c", program],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "sent " in result.stdout


def test_the_development_section_draws_the_layers_the_import_test_enforces() -> None:
    table = README.split("| layer | packages and modules |", 1)[1].split("\n\n", 1)[0]
    drawn = {
        name: int(row.group(1))
        for row in re.finditer(r"^\| (\d+) \| (.*) \|$", table, flags=re.M)
        for name in re.findall(r"`([\w.]+)`", re.sub(r"\(.*?\)", "", row.group(2)))
    }  # a name in parentheses is a note on the unit before it
    assert drawn == LAYERS
