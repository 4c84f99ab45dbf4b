"""The endpoint benchmark still runs end to end (tiny sizes; no timing asserts).

It needs RabbitMQ at ``HALFMOON_TEST_AMQP`` (default
amqp://guest:guest@127.0.0.1:5672/). Under ``CI=true`` an unreachable
RabbitMQ fails the test; elsewhere the test is skipped with the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

HM_ASYNC, HM_SYNC = "halfmoon async", "halfmoon sync"
OFFICIAL = "halfmoon async, official client"
RABBITMQ = "RabbitMQ"
PIKA = "RabbitMQ, pika"
FLOOR = "bare grpc.aio (floor)"
EVERY_SYSTEM = {HM_ASYNC, HM_SYNC, RABBITMQ}

EXPECTED_ROWS = {
    **{f"produce_p{p}_b1": EVERY_SYSTEM | {OFFICIAL, FLOOR} for p in (1, 16, 64)},
    **{f"produce_p{p}_b32": EVERY_SYSTEM for p in (1, 16, 64)},
    "send_latency": EVERY_SYSTEM,
    "e2e_latency": EVERY_SYSTEM,
    "consume": EVERY_SYSTEM,
    "blocking_send_latency": {OFFICIAL, PIKA},
    "blocking_e2e_latency": {OFFICIAL, PIKA},
}
LATENCY_ROWS = {"send_latency", "e2e_latency", "blocking_send_latency", "blocking_e2e_latency"}


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: RabbitMQ is required for the endpoint benchmark)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def amqp_url() -> str:
    try:
        from bench.amqp_peer import AmqpPeer, AmqpUnavailable, amqp_url
    except ModuleNotFoundError as exc:  # aio-pika missing
        _unavailable(f"cannot import the RabbitMQ client: {exc}")
        raise

    async def probe() -> None:
        peer = await AmqpPeer.open(url)
        await peer.close()

    url = amqp_url()
    try:
        asyncio.run(probe())
    except AmqpUnavailable as exc:
        _unavailable(str(exc))
    return url


def test_benchmark_runs_every_scenario_on_every_system(tmp_path: Path, amqp_url: str) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [
            sys.executable, "-m", "bench.grpc_bench",
            "--seconds", "0.1",
            "--latency-count", "20",
            "--e2e-count", "10",
            "--consume-messages", "200",
            "--amqp", amqp_url,
            "--json", str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())

    rows = {row["key"]: row for row in results["rows"]}
    assert set(rows) == set(EXPECTED_ROWS)
    for key, systems in EXPECTED_ROWS.items():
        measured = {m["system"]: m for m in rows[key]["measurements"]}
        assert set(measured) == systems, key
        for system, m in measured.items():
            if key in LATENCY_ROWS:
                assert m["count"] > 0, (key, system)
                assert 0 < m["p50_ms"] <= m["p99_ms"] <= m["max_ms"], (key, system)
            else:
                assert m["messages"] > 0 and m["seconds"] > 0 and m["msgs_per_s"] > 0, (key, system)
    # The consume run received and acked every pre-sent message, on every system.
    assert all(m["messages"] >= 200 for m in rows["consume"]["measurements"])

    targets = results["targets"]
    assert {t["name"] for t in targets} >= {
        "send p50, async flush",
        "send p99, async flush",
        "end-to-end p99, async flush",
        "halfmoon async: end-to-end p50 <= 1.5x RabbitMQ's",
        f"{OFFICIAL}: end-to-end p50 <= 1.5x {PIKA}'s",
        f"{OFFICIAL}: send p50 <= {PIKA}'s",
        "server CPU per single-message send, async, 16 producers",
    }
    assert all(t["measured"] > 0 for t in targets)
    assert "PASS" in proc.stdout or "MISS" in proc.stdout
    assert "vs RabbitMQ" in proc.stdout
