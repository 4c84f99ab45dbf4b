"""The exactly-once sink commits the source's consumer-group offsets in each batch's transaction
(real local Spark, real server): ``halfmoon group progress`` is exact after every batch."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from halfmoon.client import Message, SyncProducer
from tests.spark.conftest import read_topic


def _pipeline(spark, server, source: str, target: str, checkpoint: Path) -> list[int]:
    rows = (
        spark.readStream.format("halfmoon")
        .option("endpoint", server.grpc)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "25")
        .load()
    )
    query = (
        rows.selectExpr("upper(cast(body AS string)) AS body")
        .writeStream.format("halfmoon")
        .option("endpoint", server.grpc)
        .option("topic", target)
        .option("sourceGroup", "pipeline")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert not query.isActive, "the availableNow query did not finish"
    assert query.exception() is None
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def _committed(server, source: str) -> int:
    code, body = server.admin_call("GET", f"/v1/groups/pipeline/progress?topic={source}")
    assert code == 200, body
    return sum(q["committed_offset"] for q in body["queues"])


def test_group_progress_is_exact_after_the_last_batch(spark, server, tmp_path: Path) -> None:
    server.create_topic("gp-in", queues=3)
    server.create_topic("gp-out", message_type="transaction", queues=2)
    server.create_group("pipeline")
    with SyncProducer(server.grpc) as producer:
        producer.send_batch([Message("gp-in", f"a-{i}".encode()) for i in range(70)])
    checkpoint = tmp_path / "checkpoint"

    sizes = _pipeline(spark, server, "gp-in", "gp-out", checkpoint)
    assert sizes == [25, 25, 20]
    # Not one batch behind: the last batch's offsets were committed with its rows.
    assert _committed(server, "gp-in") == 70

    with SyncProducer(server.grpc) as producer:
        producer.send_batch([Message("gp-in", f"b-{i}".encode()) for i in range(30)])
    _pipeline(spark, server, "gp-in", "gp-out", checkpoint)
    assert _committed(server, "gp-in") == 100

    bodies = Counter(r.body.decode() for r in read_topic(spark, server, "gp-out"))
    assert set(bodies.values()) == {1}
    assert set(bodies) == {f"A-{i}" for i in range(70)} | {f"B-{i}" for i in range(30)}
