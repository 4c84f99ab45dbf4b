"""Spark connector benchmark: read throughput into Spark beside the Python client, and the sink.

    .venv/bin/python -m bench.spark_bench                  # 200,000 messages of 256 B, local[2]
    .venv/bin/python -m bench.spark_bench --messages 50000 --json out.json

One ``halfmoon serve`` (async flush, its own temporary directory) and one
local Spark in the same run. The topic is filled once; then, over the same
messages:

* **python client**: the project's :class:`~halfmoon.client.PullConsumer`
  (asyncio), all queues assigned, polling until every message was read. The
  peer: what one Python process does with the client a service would use.
* **connector read path, no Spark**: the code a Spark task runs
  (``read_range``: raw gRPC pulls, Arrow batches) over every queue in turn
  in this process; separates the wire from Spark's own overhead.
* **spark read → noop**: ``readStream.format("halfmoon")`` with
  ``Trigger.AvailableNow`` into Spark's ``noop`` sink; messages over the
  query's wall time (start to termination; the session is warm: a first
  query runs before the timed one, so JVM start is not counted).
* **spark batch read → count**: ``spark.read.format("halfmoon")...count()``.
* **spark sink**: the same messages copied topic → topic through the
  exactly-once sink (``Trigger.AvailableNow``, one transaction group per
  micro-batch, commit markers included).

Spark reads with one task per queue range, each a Python worker pulling by
offset and handing Arrow record batches to the JVM. Every number depends on
the machine's load: the table says the load average at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench.server_proc import REPO_ROOT, HalfmoonServer

QUEUES = 4
TARGET_READ = 50_000


@dataclass
class Result:
    scenario: str
    messages: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def fill(endpoint: str, topic: str, count: int, size: int) -> None:
    from halfmoon.client import Message, SyncProducer

    body = os.urandom(size)
    with SyncProducer(endpoint) as producer:
        for start in range(0, count, 1000):
            producer.send_batch(
                [
                    Message(topic, body, keys=[f"k{start + i}"])
                    for i in range(min(1000, count - start))
                ]
            )


async def client_read(endpoint: str, topic: str, count: int) -> Result:
    from halfmoon.client import PullConsumer

    consumer = PullConsumer(endpoint, "bench-client-reader", auto_commit=False, batch_size=1024)
    await consumer.start()
    try:
        queues = await consumer.fetch_queues(topic)
        await consumer.assign(queues)
        for queue in queues:
            await consumer.seek_to_beginning(queue)
        began, seen = time.perf_counter(), 0
        while seen < count:
            seen += len(await consumer.poll(1.0))
        return Result("python client (PullConsumer), 1 process", seen, time.perf_counter() - began)
    finally:
        await consumer.close()


def task_code_read(endpoint: str, topic: str) -> Result:
    """The Spark tasks' read path (:func:`halfmoon.spark.source.read_range`) in this process, no
    Spark."""
    from halfmoon.spark.options import source_options
    from halfmoon.spark.source import HalfmoonBatchReader, read_range

    options = source_options({"endpoint": endpoint, "topic": topic}, streaming=False)
    partitions = HalfmoonBatchReader(options).partitions()
    began, rows = time.perf_counter(), 0
    for partition in partitions:
        rows += sum(batch.num_rows for batch in read_range(options, partition.range))  # type: ignore[attr-defined]
    return Result("connector read path, no Spark, 1 process", rows, time.perf_counter() - began)


def spark_stream_read(spark: Any, endpoint: str, topic: str, checkpoint: str, label: str) -> Result:
    stream = (
        spark.readStream.format("halfmoon")
        .option("endpoint", endpoint)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerPartition", "100000")
        .load()
    )
    began = time.perf_counter()
    query = (
        stream.writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - began
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    return Result(label, rows, seconds)


def spark_batch_read(spark: Any, endpoint: str, topic: str) -> Result:
    began = time.perf_counter()
    rows = (
        spark.read.format("halfmoon")
        .option("endpoint", endpoint)
        .option("topic", topic)
        .load()
        .count()
    )
    return Result("spark batch read -> count()", rows, time.perf_counter() - began)


def spark_sink(spark: Any, endpoint: str, source: str, target: str, checkpoint: str) -> Result:
    stream = (
        spark.readStream.format("halfmoon")
        .option("endpoint", endpoint)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "100000")
        .load()
    )
    began = time.perf_counter()
    query = (
        stream.select("body", "keys")
        .writeStream.format("halfmoon")
        .option("endpoint", endpoint)
        .option("topic", target)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - began
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    return Result("spark sink (exactly-once, topic -> topic)", rows, seconds)


def tree() -> str:
    try:
        return subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Spark connector throughput beside the Python client"
    )
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=256, help="body bytes (default 256)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--json", default=None, help="write the results to this file")
    args = parser.parse_args(argv)

    from halfmoon.spark import build_session
    from halfmoon.spark.sink import MARKER_TOPIC

    results: list[Result] = []
    scratch = tempfile.TemporaryDirectory(prefix="halfmoon-spark-bench-")
    with HalfmoonServer(flush="async") as server:
        server.create_topic("bench-in", queues=QUEUES)
        server.create_topic("bench-out", queues=QUEUES, message_type="transaction")
        server.create_topic(MARKER_TOPIC, queues=1, message_type="transaction")
        server.create_topic("warmup", queues=QUEUES)
        log(f"filling bench-in with {args.messages:,} messages of {args.size} B")
        fill(server.grpc, "bench-in", args.messages, args.size)
        fill(server.grpc, "warmup", 2000, args.size)

        results.append(asyncio.run(client_read(server.grpc, "bench-in", args.messages)))
        log(f"{results[-1].scenario}: {results[-1].per_second:,.0f} msgs/s")
        results.append(task_code_read(server.grpc, "bench-in"))
        log(f"{results[-1].scenario}: {results[-1].per_second:,.0f} msgs/s")

        spark = build_session("halfmoon-spark-bench", args.master)
        spark.sparkContext.setLogLevel("ERROR")
        spark_stream_read(
            spark, server.grpc, "warmup", f"{scratch.name}/warm", "warm-up"
        )  # JVM and workers warm
        for label, run in (
            (
                "stream",
                lambda: spark_stream_read(
                    spark,
                    server.grpc,
                    "bench-in",
                    f"{scratch.name}/noop",
                    f"spark stream read -> noop ({args.master})",
                ),
            ),
            ("batch", lambda: spark_batch_read(spark, server.grpc, "bench-in")),
            (
                "sink",
                lambda: spark_sink(
                    spark, server.grpc, "bench-in", "bench-out", f"{scratch.name}/sink"
                ),
            ),
        ):
            results.append(run())
            log(f"{label}: {results[-1].per_second:,.0f} msgs/s")
        spark.stop()
    scratch.cleanup()

    load = os.getloadavg()
    client_rate = results[0].per_second
    print(f"{'scenario':<52} {'messages':>9} {'seconds':>8} {'msgs/s':>9} {'vs client':>9}")
    print("-" * 92)
    for r in results:
        print(
            f"{r.scenario:<52} {r.messages:>9,} {r.seconds:>8.2f} {r.per_second:>9,.0f} "
            f"{r.per_second / client_rate:>8.2f}x"
        )
    stream_rate = next(r.per_second for r in results if r.scenario.startswith("spark stream"))
    print(
        f"\ntarget: stream read into Spark >= {TARGET_READ:,} msgs/s: "
        f"{'PASS' if stream_rate >= TARGET_READ else 'MISS'} ({stream_rate:,.0f})"
    )
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} cpus, python "
        f"{platform.python_version()}; tree {tree()}; load average at end {load[0]:.2f} "
        f"{load[1]:.2f} {load[2]:.2f}"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {
                    "results": [asdict(r) | {"per_second": r.per_second} for r in results],
                    "load": load,
                    "tree": tree(),
                    "settings": vars(args),
                },
                out,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
