"""docs/spark.md's shell blocks run as printed (its jobs start Spark, so they run here, in the
Spark group of workers); the machinery and its rules: tests/test_doc_commands.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.netns.conftest import network, network_available  # noqa: F401 - fixtures
from tests.netns.network import VirtualNetwork
from tests.test_doc_commands import BLOCKS, SPARK_DOC, Block, run_as_printed

SPARK_BLOCKS = [b for b in BLOCKS if b.doc == SPARK_DOC]


def test_the_spark_page_has_its_jobs_and_the_example() -> None:
    commands = [c.text for b in SPARK_BLOCKS for c in b.commands]
    assert any(c.startswith("halfmoon spark audit ") for c in commands)
    assert any(c.startswith("halfmoon spark stats ") for c in commands)
    assert any("-m examples.pipeline.run" in c for c in commands)


@pytest.mark.slow
@pytest.mark.parametrize("block", SPARK_BLOCKS, ids=[b.id for b in SPARK_BLOCKS])
def test_spark_doc_commands_run_as_printed(
    block: Block,
    network: VirtualNetwork,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    run_as_printed(block, network, tmp_path)
