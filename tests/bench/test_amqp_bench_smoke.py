"""The AMQP benchmark still runs end to end (tiny sizes; no timing asserts).

RabbitMQ and both floors are measured through both clients; halfmoon's rows
are there when its AMQP listener answers, and say why when it does not.
"""

from __future__ import annotations

from pathlib import Path

from bench.amqp_bench import FLOOR, FLOOR_UVLOOP, HALFMOON, RABBITMQ
from tests.bench.runner import run_bench
from tests.peers.servers import halfmoon_speaks_amqp, require_rabbitmq

THROUGHPUTS = ("confirmed_1", "confirmed_16", "tx_1", "tx_10")


def test_amqp_bench_measures_rabbitmq_the_floors_and_halfmoon_when_it_speaks_amqp(
    tmp_path: Path,
) -> None:
    require_rabbitmq()
    stdout, report = run_bench(
        "bench.amqp_bench", "--seconds", "0.3", "--count", "10", "--consume", "200",
        "--tx-fill", "10", "--fanout", "100",
        json_path=tmp_path / "amqp.json", timeout=300,
    )  # fmt: skip
    assert "halfmoon ÷ RabbitMQ" in stdout
    results = report["results"]
    measured = [RABBITMQ, FLOOR, FLOOR_UVLOOP] + ([HALFMOON] if halfmoon_speaks_amqp() else [])
    for system in measured:
        for client in ("aio-pika", "pika"):
            rows = results[system][client]
            assert "missing" not in rows, (system, client, rows)
            assert rows["end_to_end"]["p50_ms"] > 0, (system, client)
            for scenario in THROUGHPUTS:
                assert rows[scenario]["per_second"] > 0, (system, client, scenario)
        consume = results[system]["aio-pika"]["consume_4x100"]
        assert consume["count"] == 200, (system, consume)
    # The server's own write counters: RabbitMQ persists every fanout message.
    assert results[RABBITMQ]["aio-pika"]["fanout_10"]["wchar"] > 0
    if not halfmoon_speaks_amqp():
        assert "no AMQP listener" in results[HALFMOON]["missing"]
    else:  # stored once: the log grows by about one record a fanout, not ten
        fanout = results[HALFMOON]["aio-pika"]["fanout_10"]
        assert fanout["record_bytes"] > 1024, fanout
        assert 0 < fanout["commit_log_ratio"] < 2, fanout
