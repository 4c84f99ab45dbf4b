"""The halfmoon source on a local Spark against a real server.

Only committed messages are read (rolled-back and pending transaction groups
never appear, a pending one appears once committed); filters run on the
broker; a streaming query resumes from its checkpoint with no gap and no
duplicate; ``maxRecordsPerTrigger`` bounds every micro-batch.
"""

from __future__ import annotations

from pathlib import Path

from halfmoon.client import Message, SyncProducer
from halfmoon.spark.wire import Wire
from tests.spark.conftest import read_topic


def test_only_committed_messages_are_read_and_filters_run_on_the_broker(spark, server) -> None:
    server.create_topic("mixed-in", message_type="mixed", queues=2)
    with SyncProducer(server.grpc) as producer:
        producer.send_batch(
            [
                Message("mixed-in", f"plain-{i}".encode(), tag="plain", properties={"n": str(i)})
                for i in range(10)
            ]
        )
    wire = Wire(server.grpc)
    wire.send_halves(
        [Message("mixed-in", f"committed-{i}".encode(), tag="txn") for i in range(5)], "g-commit"
    )
    wire.end_group("g-commit", "mixed-in", commit=True)
    wire.send_halves(
        [Message("mixed-in", f"rolled-back-{i}".encode(), tag="txn") for i in range(5)],
        "g-rollback",
    )
    wire.end_group("g-rollback", "mixed-in", commit=False)
    wire.send_halves(
        [Message("mixed-in", f"pending-{i}".encode(), tag="txn") for i in range(5)], "g-pending"
    )

    bodies = sorted(r.body.decode() for r in read_topic(spark, server, "mixed-in"))
    assert bodies == sorted(
        [f"plain-{i}" for i in range(10)] + [f"committed-{i}" for i in range(5)]
    )

    rows = read_topic(spark, server, "mixed-in", filter="txn")
    assert sorted(r.body.decode() for r in rows) == [f"committed-{i}" for i in range(5)]
    assert all(r.transaction_id == r.message_id for r in rows)
    sql = read_topic(spark, server, "mixed-in", filter="n >= 7", filterType="sql92")
    assert sorted(r.body.decode() for r in sql) == ["plain-7", "plain-8", "plain-9"]
    row = next(
        r for r in read_topic(spark, server, "mixed-in", filter="plain") if r.body == b"plain-3"
    )
    assert row.properties["n"] == "3" and row.tag == "plain" and row.store_timestamp is not None

    wire.end_group(
        "g-pending", "mixed-in", commit=True
    )  # pending, not lost: visible once committed
    assert len(read_topic(spark, server, "mixed-in")) == 20

    ending = '{"mixed-in": {"0": 2, "1": 3}}'
    assert len(read_topic(spark, server, "mixed-in", endingOffsets=ending)) == 5


def _run_stream(spark, server, topic: str, checkpoint: Path, out: Path, limit: int) -> list[int]:
    stream = (
        spark.readStream.format("halfmoon")
        .option("endpoint", server.grpc)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", str(limit))
        .option("commitOffsets", "true")
        .option("group", "spark-reader")
        .load()
    )
    query = (
        stream.select("message_id", "queue_id", "queue_offset", "body")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive, "the availableNow query did not finish"
    assert query.exception() is None
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_stream_resumes_from_checkpoint_without_gap_or_duplicate_and_honours_max_records(
    spark, server, tmp_path: Path
) -> None:
    server.create_topic("stream-in", queues=3)
    with SyncProducer(server.grpc) as producer:
        first = producer.send_batch([Message("stream-in", f"a-{i}".encode()) for i in range(70)])
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"

    sizes = _run_stream(spark, server, "stream-in", checkpoint, out, limit=25)
    assert sizes == [25, 25, 20]  # admission control: every trigger at most 25 rows

    with SyncProducer(server.grpc) as producer:
        second = producer.send_batch([Message("stream-in", f"b-{i}".encode()) for i in range(30)])
    sizes = _run_stream(spark, server, "stream-in", checkpoint, out, limit=25)
    assert sum(sizes) == 30 and max(sizes) <= 25  # only the new messages after the restart

    rows = spark.read.parquet(str(out)).collect()
    ids = [r.message_id for r in rows]
    assert len(ids) == len(set(ids)) == 100
    assert set(ids) == {r.message_id for r in first + second}

    # commitOffsets: Spark commits a batch's end to the source when the next batch runs, so the
    # group's offsets trail by at most the last batch.
    queues = server.admin_call("GET", "/v1/groups/spark-reader/progress?topic=stream-in")[1][
        "queues"
    ]
    assert 100 - sizes[-1] <= sum(q["committed_offset"] for q in queues) <= 100


def test_stats_counts_messages_in_and_consumed_per_window(spark, server) -> None:
    from halfmoon.spark.jobs.stats import StatsSpec, run_stats

    server.create_topic("stats-in", queues=2)
    with SyncProducer(server.grpc) as producer:
        producer.send_batch([Message("stats-in", b"x") for _ in range(30)])
    wire = Wire(server.grpc)
    queues = wire.queues("stats-in")
    for queue in queues:
        wire.commit_offset("stats-reader", queue, min(5, wire.query_offset(queue, "latest")))
    rows = run_stats(
        spark, StatsSpec(server.grpc, ("stats-in",), ("stats-reader",), "1 hour")
    ).collect()
    totals: dict[str, int] = {}
    for row in rows:
        totals[row.group] = totals.get(row.group, 0) + row.messages
    assert totals == {"-": 30, "stats-reader": 10}
