"""The gRPC stacks benchmark still runs end to end (tiny sizes; no timing asserts)."""

from __future__ import annotations

from pathlib import Path

from bench.grpc_stacks import HALFMOON, STACKS
from tests.bench.runner import run_bench


def test_grpc_stacks_bench_measures_every_stack_halfmoon_and_rabbitmq(tmp_path: Path) -> None:
    stdout, report = run_bench(
        "bench.grpc_stacks", "--rounds", "1", "--calls", "20", "--seconds", "0.3",
        json_path=tmp_path / "stacks.json", timeout=300,
    )  # fmt: skip
    assert "end to end ÷ end to end" in stdout
    (one,) = report["rounds"]
    assert [r["stack"] for r in one["stacks"]] == [*STACKS, HALFMOON]
    for r in one["stacks"]:
        # Every server answered the sends, a send woke its parked long poll, and the
        # senders' calls were counted (a failed call raises).
        assert r["send_p50_ms"] > 0 and r["end_to_end_p50_ms"] > 0, r
        assert r["calls_per_second"] > 0 and r["server_cpu_us_per_call"] > 0, r
        assert (r["receive_p50_ms"] > 0) == (r["stack"] != HALFMOON), r
    rabbitmq = one["rabbitmq"]  # measured in the same round
    assert rabbitmq["send_p50_ms"] > 0 and rabbitmq["end_to_end_p50_ms"] > 0, rabbitmq
    assert rabbitmq["back_to_back_p50_ms"] > 0, rabbitmq
