"""The proxy benchmark still runs end to end (tiny sizes; no timing asserts).

Local mode, a broker with one and with two proxy processes, a cluster proxy
with one and two workers (etcd, which ``./run test`` installs), and RabbitMQ,
as in ``bench/proxy_bench.py``; RabbitMQ as the endpoint benchmark's smoke
test finds it (a failure under ``CI=true``, else a skip).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.proxy_bench import beam_pid
from tests.bench.test_grpc_bench_smoke import amqp_url  # noqa: F401 - the fixture

REPO_ROOT = Path(__file__).resolve().parents[2]
PROCESSES = {
    "local": {"serve"},
    "cluster 1p": {"broker", "proxy1"},
    "cluster 2p": {"broker", "proxy1", "proxy2"},
    "cluster 1w": {"broker", "proxy"},
    "cluster 2w": {"broker", "proxy", "proxy-w1", "proxy-w2"},
    # RabbitMQ's CPU is measured when its Erlang VM runs on this machine (not in a container).
    "rabbitmq": {"beam.smp"} if beam_pid() is not None else set(),
}


def test_benchmark_measures_every_target_with_cpu_per_process(
    tmp_path: Path,
    amqp_url: str,  # noqa: F811 - the imported fixture
) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [
            sys.executable, "-m", "bench.proxy_bench",
            "--seconds", "0.1",
            "--producers", "1,2",
            "--amqp", amqp_url,
            "--json", str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    seen = {(r["target"], r["client"], r["producers"]) for r in rows}
    expected = {
        (target, client, producers)
        for target in PROCESSES
        for client in (("raw",) if target == "rabbitmq" else ("raw", "official"))
        for producers in (1, 2)
    }
    assert seen == expected
    for row in rows:
        assert row["messages"] > 0 and row["seconds"] > 0, row
        assert 0 < row["p50_ms"] <= row["p99_ms"], row
        assert set(row["cpu_us_per_msg"]) == PROCESSES[row["target"]], row
        assert all(us >= 0 for us in row["cpu_us_per_msg"].values()), row
        if row["target"].startswith("cluster"):  # the broker's count of internal requests
            assert row["msgs_per_request"] >= 1, row
        else:
            assert row["msgs_per_request"] is None, row
    broker_cpu = sum(r["cpu_us_per_msg"].get("broker", 0) for r in rows)
    assert broker_cpu > 0, "the broker process did no measurable work: the sends bypassed it"
    assert "target ≤ 40" in proc.stdout and "vs local" in proc.stdout
