"""The page-cache benchmark still runs (tiny sizes; no timing asserts)."""

from __future__ import annotations

from pathlib import Path

from tests.bench.runner import run_bench


def test_page_cache_bench_measures_every_way_of_writing(tmp_path: Path) -> None:
    stdout, report = run_bench(
        "bench.page_cache", "--dir", str(tmp_path), "--size-mib", "8", "--fill-mib", "2",
        "--probes", "20", json_path=tmp_path / "page-cache.json", timeout=120,
    )  # fmt: skip
    assert "MADV_RANDOM" in stdout
    rows = report["results"]
    assert set(rows) == {"mmap, default advice", "mmap, MADV_RANDOM", "pwrite"}
    for row in rows.values():
        assert row["start_p50_ms"] > 0 and row["deep_p50_ms"] > 0
    assert list(tmp_path.iterdir()) == [tmp_path / "page-cache.json"]  # its file is removed
