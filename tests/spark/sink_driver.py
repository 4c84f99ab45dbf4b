"""A Spark driver for the sink crash test: copy one topic into another through the exactly-once
sink.

    python -m tests.spark.sink_driver ENDPOINT SOURCE_TOPIC TARGET_TOPIC CHECKPOINT MAX_PER_TRIGGER

Runs one ``Trigger.AvailableNow`` query and exits 0. The test sets
``HALFMOON_SPARK_SINK_FAILPOINT`` to stop it at a point of the commit
protocol, then SIGKILLs its process group: the Python driver and the JVM.
PySpark's worker daemons each run in a process group of their own and exit,
with their workers, when the JVM's pipe to them closes (test_sink checks it).
"""

from __future__ import annotations

import sys

from halfmoon.spark import build_session


def main(endpoint: str, source: str, target: str, checkpoint: str, limit: str) -> int:
    spark = build_session("halfmoon-sink-driver", "local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    rows = (
        spark.readStream.format("halfmoon")
        .option("endpoint", endpoint)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", limit)
        .load()
    )
    query = (
        rows.selectExpr("body", "array(message_id) AS keys", "'copied' AS tag")
        .writeStream.format("halfmoon")
        .option("endpoint", endpoint)
        .option("topic", target)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:6]))
