"""The transactional messages benchmark still runs end to end (tiny sizes; no timing asserts)."""

from __future__ import annotations

from pathlib import Path

from tests.bench.runner import run_bench

SYSTEMS = ("halfmoon sync", "halfmoon async")
THROUGHPUT_KEYS = ("plain_send", "txn_send_commit")
LATENCY_KEYS = ("commit_to_visible", "end_transaction_rtt")
ORPHANS = 200


def test_txn_bench_runs_every_scenario(tmp_path: Path) -> None:
    stdout, report = run_bench(
        "bench.txn_bench",
        "--seconds", "0.2", "--rounds", "1", "--latency-count", "10", "--orphans", str(ORPHANS),
        json_path=tmp_path / "txn.json", timeout=150,
    )  # fmt: skip
    assert "PASS" in stdout or "MISS" in stdout

    results = {(r["key"], r["system"]): r for r in report["results"]}
    for system in SYSTEMS:
        for key in THROUGHPUT_KEYS:
            r = results[(key, system)]
            assert r["messages"] > 0 and r["seconds"] > 0 and r["msgs_per_s"] > 0, r
        txn = results[("txn_send_commit", system)]
        assert txn["ratio_to_plain"] > 0
        assert txn["pending_after"] == 0  # every committed half message left the pending set
        for key in LATENCY_KEYS:
            r = results[(key, system)]
            assert r["count"] == 10 and 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"], r

    # The orphan scenario runs on the sync server: every orphan committed through a check.
    orphans = results[("orphans", "halfmoon sync")]
    assert orphans["unresolved"] == 0 and orphans["messages"] == ORPHANS
    assert orphans["checks_answered"] >= ORPHANS
    assert orphans["scans"] >= 1 and orphans["scan_candidates"] >= ORPHANS
    assert orphans["scan_wall_us_per_message"] > 0
    assert ("orphans", "halfmoon async") not in results
    # Beside its peer: the same producer answering as many checks itself, in the same run.
    peer = results[("check_answers", "halfmoon sync")]
    assert peer["messages"] == ORPHANS and peer["seconds"] > 0
    assert orphans["ratio_to_answers"] > 0 and orphans["server_cpu_us_per_orphan"] > 0

    names = {t["name"] for t in report["targets"]}
    assert len(names) == 5 and all(t["measured"] > 0 for t in report["targets"])
