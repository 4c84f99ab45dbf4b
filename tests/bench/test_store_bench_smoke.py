"""The store benchmark still runs end to end (tiny sizes; no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import peers
from bench.report import HALFMOON

REPO_ROOT = Path(__file__).resolve().parents[2]

EXPECTED_ROWS = {
    "append_async_128": {HALFMOON, peers.RAW_APPEND, peers.SQLITE_APPEND},
    "append_async_1024": {HALFMOON, peers.RAW_APPEND, peers.SQLITE_APPEND},
    "append_async_16384": {HALFMOON, peers.RAW_APPEND, peers.SQLITE_APPEND},
    "read_1024": {HALFMOON, peers.RAW_READ, peers.SQLITE_READ},
    "read_128": {HALFMOON, peers.RAW_READ, peers.SQLITE_READ},
    **{
        f"append_sync_{n}": {HALFMOON, peers.RAW_SYNC, peers.RAW_GROUP, peers.SQLITE_SYNC}
        for n in (1, 16, 64)
    },
}


def test_benchmark_runs_every_scenario_on_every_system(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    scratch = tmp_path / "scratch"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.store_bench",
            "--messages",
            "300",
            "--big-messages",
            "40",
            "--sync-seconds",
            "0.1",
            "--dir",
            str(scratch),
            "--json",
            str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())

    rows = {row["key"]: row for row in results["rows"]}
    assert set(rows) == set(EXPECTED_ROWS)
    for key, systems in EXPECTED_ROWS.items():
        measured = {m["system"]: m for m in rows[key]["measurements"]}
        assert set(measured) == systems, key
        for system, m in measured.items():
            assert m["messages"] > 0 and m["bytes"] > 0, (key, system)
            assert m["msgs_per_s"] > 0 and m["mb_per_s"] > 0, (key, system)
            if system != HALFMOON:
                assert m["halfmoon_ratio"] > 0, (key, system)
    # Reads read back exactly what was written.
    assert rows["read_1024"]["measurements"][0]["messages"] == 300

    targets = {t["name"]: t for t in results["targets"]}
    assert len(targets) == 5
    assert all(t["measured"] > 0 for t in targets.values())
    # The table is printed, and the scratch data is gone.
    assert "PASS" in proc.stdout or "MISS" in proc.stdout
    assert "append sync 1 KiB, 64 writers" in proc.stdout
    assert list(scratch.iterdir()) == []
