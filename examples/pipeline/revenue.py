"""Order events → revenue per minute, written exactly once to a halfmoon topic and to Parquet.

The order service publishes one JSON event per order (``order_id``,
``amount``, ``event_time``) to ``order-events``. This pipeline:

1. reads the topic with the ``halfmoon`` source (committed messages only, so
   an order whose transaction rolled back is never counted);
2. parses the events and tracks event time with a 2-minute watermark: an
   event up to 2 minutes late still lands in its minute, a later one is
   dropped rather than reopening a published minute;
3. sums revenue per 1-minute event-time window (append mode: each minute
   is emitted once, when the watermark passes its end);
4. writes each emitted minute twice, each query with its own checkpoint:
   to the ``revenue-per-minute`` topic through the exactly-once sink, and to
   Parquet (Spark's file sink, exactly-once through its own log).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

EVENT_SCHEMA = "order_id string, kind string, amount double, event_time timestamp"
WATERMARK = "2 minutes"
WINDOW = "1 minute"


def revenue_per_minute(
    spark: SparkSession, endpoint: str, topic: str, max_per_trigger: int = 100
) -> DataFrame:
    events = (
        spark.readStream.format("halfmoon")
        .option("endpoint", endpoint)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", str(max_per_trigger))
        .load()
        .select(F.from_json(F.col("body").cast("string"), EVENT_SCHEMA).alias("e"))
        .select("e.*")
        .withWatermark("event_time", WATERMARK)
    )
    # "tick" events (amount 0) move event time, and so the watermark, forward. They are not
    # filtered out: Spark pushes filters below the watermark, which would then never see them.
    return (
        events.groupBy(F.window("event_time", WINDOW).alias("minute"))
        .agg(
            F.round(F.sum("amount"), 2).alias("revenue"),
            F.count_if(F.col("kind") == "order").alias("orders"),
        )
        .select(
            F.col("minute.start").alias("minute_start"),
            F.col("minute.end").alias("minute_end"),
            "revenue",
            "orders",
        )
    )


def start_outputs(
    revenue: DataFrame,
    endpoint: str,
    out_topic: str,
    parquet_dir: str,
    checkpoints: str,
    *,
    available_now: bool = True,
) -> list[StreamingQuery]:
    """The two exactly-once outputs of the revenue stream."""
    as_messages = revenue.select(
        F.to_json(F.struct("minute_start", "minute_end", "revenue", "orders")).alias("body"),
        F.array(F.date_format("minute_start", "yyyy-MM-dd'T'HH:mm")).alias("keys"),
        F.lit("revenue").alias("tag"),
    )
    to_topic = (
        as_messages.writeStream.format("halfmoon")
        .option("endpoint", endpoint)
        .option("topic", out_topic)
        .option("checkpointLocation", f"{checkpoints}/topic")
        .outputMode("append")
    )
    to_parquet = (
        revenue.writeStream.format("parquet")
        .option("path", parquet_dir)
        .option("checkpointLocation", f"{checkpoints}/parquet")
        .outputMode("append")
    )
    if available_now:
        # Drains what is there and stops; the watermark's last move is applied only by a later run.
        to_topic, to_parquet = (
            to_topic.trigger(availableNow=True),
            to_parquet.trigger(availableNow=True),
        )
    else:
        to_topic, to_parquet = (
            to_topic.trigger(processingTime="1 second"),
            to_parquet.trigger(processingTime="1 second"),
        )
    return [to_topic.start(), to_parquet.start()]
