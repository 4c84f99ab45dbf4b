"""The collector benchmark still runs end to end (tiny sizes; no timing asserts)."""

from __future__ import annotations

from pathlib import Path

from bench.gc_bench import ROWS, VARIANTS
from tests.bench.runner import run_bench


def test_gc_bench_runs_and_reports_every_row_for_both_variants(tmp_path: Path) -> None:
    stdout, report = run_bench(
        "bench.gc_bench", "--messages", "2000", "--seconds", "0.4", "--rounds", "1",
        json_path=tmp_path / "gc.json", timeout=300,
    )  # fmt: skip
    assert "frozen/untouched server CPU per message" in stdout
    rows = report["rows"]
    assert {(r["variant"], r["row"]) for r in rows} == {(v, r) for v in VARIANTS for r in ROWS}
    assert all(r["messages"] > 0 and r["server_cpu_us"] > 0 for r in rows), rows
