"""The Spark connector benchmark still runs end to end (tiny sizes; no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_spark_bench_runs_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "spark.json"
    cmd = [
        sys.executable, "-m", "bench.spark_bench",
        "--messages", "4000", "--batch-rows", "1000", "--sink-messages", "1000",
        "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stream vs parquet" in done.stdout

    results = {r["scenario"]: r for r in json.loads(out.read_text())["results"]}
    peer = results["peer: spark parquet file read -> noop"]
    stream = results["spark stream read -> noop (local[2])"]
    for row in (peer, stream):
        # Four micro-batches of 1,000 rows each, the same for the source and the peer.
        assert row["messages"] == 4000 and row["steady"] > 0, row
    assert results["spark batch read -> count()"]["messages"] == 4000
    assert results["spark sink (exactly-once, topic -> topic)"]["messages"] == 1000
    assert results["before: connector read path via PullMessage"]["messages"] == 1000
