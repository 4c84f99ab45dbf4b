"""The consume-transform-produce benchmark still runs end to end (tiny sizes; no timing asserts)."""

from __future__ import annotations

from pathlib import Path

from tests.bench.runner import run_bench


def test_ctp_bench_runs_every_scenario(tmp_path: Path) -> None:
    stdout, report = run_bench(
        "bench.ctp_bench", "--messages", "120", "--workers", "2", "--rounds", "1",
        json_path=tmp_path / "ctp.json", timeout=150,
    )  # fmt: skip
    assert "PASS" in stdout or "MISS" in stdout
    scenarios = {r["scenario"]: r for r in report["results"]}
    assert set(scenarios) == {"plain", "tx1", "tx10", "tx100"}
    for r in scenarios.values():
        assert r["messages"] >= 120 and r["msgs_per_s"] > 0 and r["server_cpu_us_per_msg"] > 0
