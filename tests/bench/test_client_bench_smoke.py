"""The client benchmark still runs end to end (tiny sizes; no timing asserts)."""

from __future__ import annotations

from pathlib import Path

from tests.bench.runner import run_bench

OFFICIAL = "official client"
EXPECTED_ROWS = {
    "send_s1": {OFFICIAL, "halfmoon", "halfmoon, coalesce=False"},
    "send_s16": {OFFICIAL, "halfmoon", "halfmoon, coalesce=False"},
    "receive": {OFFICIAL, "halfmoon", "halfmoon, acks one at a time"},
}


def test_client_bench_runs_and_reports_every_row(tmp_path: Path) -> None:
    stdout, report = run_bench(
        "bench.client_bench", "--seconds", "0.2", "--rounds", "1", "--receive-messages", "64",
        json_path=tmp_path / "client.json", timeout=180,
    )  # fmt: skip
    assert "vs official" in stdout and "target:" in stdout

    rows = {row["key"]: row for row in report["rows"]}
    assert set(rows) == set(EXPECTED_ROWS)
    for key, systems in EXPECTED_ROWS.items():
        measurements = {m["system"]: m for m in rows[key]["measurements"]}
        assert set(measurements) == systems, key
        for system, m in measurements.items():
            assert m["messages"] > 0 and m["seconds"] > 0 and m["msgs_per_s"] > 0, (key, system, m)
            if system != OFFICIAL:
                assert m["vs_official"] > 0, (key, system, m)
    assert rows["receive"]["measurements"][0]["messages"] >= 64
    assert (
        "messages per request"
        in {m["system"]: m for m in rows["send_s16"]["measurements"]}["halfmoon"]["note"]
    )
