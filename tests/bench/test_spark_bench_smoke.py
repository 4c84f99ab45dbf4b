"""The Spark connector benchmark still runs end to end (tiny sizes; no timing asserts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.runner import run_bench

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

pytestmark = pytest.mark.slow  # minutes on a busy machine: handed to a worker early


def test_spark_bench_runs_every_scenario(tmp_path: Path) -> None:
    stdout, report = run_bench(
        "bench.spark_bench",
        "--messages", "4000", "--batch-rows", "1000", "--sink-messages", "1000",
        json_path=tmp_path / "spark.json", timeout=400,
    )  # fmt: skip
    assert "stream vs parquet" in stdout

    results = {r["scenario"]: r for r in report["results"]}
    peer = results["peer: spark parquet file read -> noop"]
    stream = results["spark stream read -> noop (local[2])"]
    for row in (peer, stream):
        # Four micro-batches of 1,000 rows each, the same for the source and the peer.
        assert row["messages"] == 4000 and row["steady"] > 0, row
    assert results["spark batch read -> count()"]["messages"] == 4000
    assert results["spark sink (exactly-once, topic -> topic)"]["messages"] == 1000
    assert results["spark sink, 2,000 rows (a query's fixed cost)"]["messages"] == 2000
    assert (
        results["peer: Python source -> Python sink doing nothing, 2,000 rows"]["messages"] == 2000
    )
    assert results["before: connector read path via PullMessage"]["messages"] == 1000
