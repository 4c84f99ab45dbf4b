"""``halfmoon spark stats``: messages in and out per topic and consumer group, by time window.

From the broker's data, not from its in-memory counters (which ``halfmoon
status`` shows for the last 24 hours): the topic's committed messages are
read with the ``halfmoon`` source and counted per ``window`` of their store
time ("in"); a consumer group's "out" in a window is how many of those
messages lie below the group's committed offset in their queue, i.e. were
consumed by offset (pull consumers, Spark with ``commitOffsets``, or pop
consumers whose progress the broker keeps as an offset). So "out" is
attributed to the window a message *arrived* in: a group's backlog shows
as in > out in the recent windows.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from halfmoon.client.credentials import Credentials
from halfmoon.spark.wire import Wire


@dataclass(frozen=True)
class StatsSpec:
    endpoint: str
    topics: tuple[str, ...]
    groups: tuple[str, ...] = ()
    window: str = "1 minute"
    since_ms: int | None = None


def committed_offsets(spec: StatsSpec) -> list[tuple[str, str, int, int]]:
    """``(group, topic, queue_id, committed offset)`` for every group and queue with an offset."""
    wire = Wire(spec.endpoint, Credentials.from_env())
    out = []
    for topic in spec.topics:
        for queue in wire.queues(topic):
            for group in spec.groups:
                offset = wire.committed_offset(group, queue)
                if offset is not None:
                    out.append((group, topic, queue.queue_id, offset))
    return out


def run_stats(spark: SparkSession, spec: StatsSpec) -> DataFrame:
    """Rows ``(window_start, window_end, topic, group, messages)``; group ``-`` is messages in."""
    reader = (
        spark.read.format("halfmoon")
        .option("endpoint", spec.endpoint)
        .option("topics", ",".join(spec.topics))
    )
    if spec.since_ms is not None:
        reader = reader.option("startingOffsets", f"timestamp:{spec.since_ms}")
    messages = reader.load().select(
        "topic", "queue_id", "queue_offset", F.window("store_timestamp", spec.window).alias("w")
    )
    incoming = (
        messages.groupBy("w", "topic")
        .agg(F.count("*").alias("messages"))
        .withColumn("group", F.lit("-"))
    )
    result = incoming
    offsets = committed_offsets(spec)
    if offsets:
        committed = spark.createDataFrame(
            offsets, "group string, topic string, queue_id int, committed bigint"
        )
        consumed = (
            messages.join(committed, ["topic", "queue_id"])
            .where(F.col("queue_offset") < F.col("committed"))
            .groupBy("w", "topic", "group")
            .agg(F.count("*").alias("messages"))
        )
        result = result.unionByName(consumed)
    return result.select(
        F.col("w.start").alias("window_start"),
        F.col("w.end").alias("window_end"),
        "topic",
        "group",
        "messages",
    ).orderBy("window_start", "topic", "group")
