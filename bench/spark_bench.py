"""Spark connector benchmark: reads into Spark beside Spark reading Parquet, and the sink.

    .venv/bin/python -m bench.spark_bench                  # 400,000 messages of 256 B, local[2]
    .venv/bin/python -m bench.spark_bench --messages 50000 --json out.json
    .venv/bin/python -m bench.spark_bench --sink-only      # the sink rows alone

One ``halfmoon serve`` (async flush, its own temporary directory) and one
local Spark in the same run. A topic is filled once with ``--messages``
messages, and a second one with ``--sink-messages`` (100,000) for the sink
and the PullMessage row; then, over the same messages:

* **python client**: the project's :class:`~halfmoon.client.PullConsumer`
  (asyncio), all queues assigned, polling until every message was read. The
  peer: what one Python process does with the client a service would use.
* **connector read path, no Spark**: the code a Spark task runs
  (``read_range``: BulkRead calls, Arrow batches) over every queue in turn
  in this process; separates the wire from Spark's own overhead. Also run
  once through PullMessage (**before**: the path the source took before
  BulkRead, one stream response per message; over the smaller topic).
* **spark read -> noop**: ``readStream.format("halfmoon")`` with
  ``Trigger.AvailableNow`` and ``maxRecordsPerTrigger`` ``--batch-rows``
  (100,000) into Spark's ``noop`` sink.
* **spark batch read -> count**: ``spark.read.format("halfmoon")...count()``.
* **spark sink**: the second topic copied topic -> topic through the
  exactly-once sink (``Trigger.AvailableNow``, ``--batch-rows`` per
  micro-batch, one transaction group per micro-batch, commit markers
  included). Before it, **spark sink, 2,000 rows**: the same query over
  2,000 messages, what a sink query costs whatever its size (starting the
  query, the source's planning, the commit protocol, stopping it), and its
  peer, **Python source -> Python sink doing nothing** over 2,000 rows: what
  any query through a Python data source costs Spark itself.
* **sink task code, no Spark** (``--sink-only``): what a sink task and the
  driver run (``write_group`` then ``CommitProtocol.commit``) over the same
  rows in this process, one transaction group per 100,000 messages;
  separates the sink's wire and broker costs from Spark's.
* **peer: spark parquet read -> noop**: the same rows (the connector's
  schema, written with pyarrow to local Parquet files of a quarter of
  ``--batch-rows`` each) read by Spark's own file source the same way
  (``readStream``, ``AvailableNow``, ``maxFilesPerTrigger`` 4: micro-batches
  of as many rows as the source's, noop): what Spark does with data that
  needs no broker at all. The ratio columns compare every Spark scenario
  with it.

Two rates per streaming query: **msgs/s**, messages over the query's wall
time (start to termination, so it includes starting the query: the Python
processes Spark starts for the source's planning, the first batch's
planning); and **steady/s**, rows over the execution time Spark reports for
each micro-batch after the first (offsets, planning, the batch, the
commit): the rate a backlog drains at, which is what the targets are about.
The session is warm (JVM started and a first query of each kind, the sink's
included, run before the timed ones), so neither counts JVM start-up.

Each scenario also reports the server's CPU (user + system, every thread,
from /proc) per message it moved.

Spark reads with one task per queue range, each a Python worker reading by
offset through ``halfmoon.v1.BulkRead`` (thousands of messages per call,
columnar, one call in flight while the previous answer is converted) and
handing Arrow record batches to the JVM. Every number depends on the
machine's load: the table says the load average at the end.
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

from bench.cluster_bench import cpu_seconds
from bench.server_proc import REPO_ROOT, HalfmoonServer

QUEUES = 4
TARGET_READ = 50_000
TARGET_SINK = 20_000
SOURCE_OPTIONS: dict[str, str] = {}  # extra source options for every Spark read (--pull-batch-size)


@dataclass
class Result:
    scenario: str
    messages: int
    seconds: float
    server_cpu: float = 0.0  # seconds of the server's CPU during the scenario
    reader_cpu: float = 0.0  # this process and its other descendants (Spark's JVM, workers)
    # A streaming query's rows over its micro-batches' execution time, the first batch left
    # out (it carries the query's one-time costs): the rate a backlog drains at. 0: not
    # measured (not a stream, or a single micro-batch).
    steady: float = 0.0

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0


def steady_rate(progress: list[dict[str, Any]]) -> float:
    """Rows per second over the micro-batches after the first (Spark's own timing of each
    trigger: offsets, planning, the batch, the commit), 0.0 for fewer than two batches."""
    batches = [p for p in progress if p["numInputRows"] > 0][1:]
    millis = sum(p["durationMs"]["triggerExecution"] for p in batches)
    return sum(p["numInputRows"] for p in batches) / millis * 1000 if millis else 0.0


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def reader_cpu_seconds(server_pid: int) -> float:
    """CPU of this process and every descendant except the server: the Python client, or
    Spark's JVM and its Python workers (from /proc; a process that exited is not counted)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat_file:
                    stat = stat_file.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(stat[1])
    mine, total = {os.getpid()}, 0.0
    changed = True
    while changed:
        changed = False
        for pid, parent in parents.items():
            if parent in mine and pid not in mine and pid != server_pid:
                mine.add(pid)
                changed = True
    for pid in mine:
        try:
            total += cpu_seconds(pid)
        except OSError:
            continue
    return total


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


def task_code_read(
    endpoint: str, topic: str, parquet: str | None, file_rows: int = 25_000
) -> Result:
    """The Spark tasks' read path (:func:`halfmoon.spark.source.read_range`) in this process, no
    Spark; the rows it read are written to ``parquet`` afterwards (untimed), for the peer, in
    files of ``file_rows`` rows (so the peer's micro-batches can match the source's).
    ``parquet`` None: through PullMessage instead of BulkRead (the read path before BulkRead)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from halfmoon.spark import source
    from halfmoon.spark.options import source_options
    from halfmoon.spark.source import HalfmoonBatchReader, read_range

    if parquet is None:
        source._NO_BULK_READ.add(endpoint)  # as against a server without BulkRead
    else:
        source._NO_BULK_READ.discard(endpoint)

    options = source_options(
        {"endpoint": endpoint, "topic": topic, **SOURCE_OPTIONS}, streaming=False
    )
    partitions = HalfmoonBatchReader(options).partitions()
    batches: list[Any] = []
    began = time.perf_counter()
    for partition in partitions:
        batches.extend(read_range(options, partition.range))  # type: ignore[attr-defined]
    seconds = time.perf_counter() - began
    rows = sum(b.num_rows for b in batches)
    if parquet is None:
        source._NO_BULK_READ.discard(endpoint)
        return Result("before: connector read path via PullMessage", rows, seconds)
    os.makedirs(parquet, exist_ok=True)
    table = pa.Table.from_batches(batches)
    for number, start in enumerate(range(0, table.num_rows, file_rows)):
        pq.write_table(table.slice(start, file_rows), f"{parquet}/rows-{number:05d}.parquet")
        time.sleep(0.01)  # distinct modification times: the file source takes them in order
    return Result("connector read path, no Spark, 1 process", rows, seconds)


def spark_parquet_read(spark: Any, parquet: str, checkpoint: str, files_per_batch: int) -> Result:
    """The peer: Spark's file source over the same rows, streamed into the noop sink, in
    micro-batches of ``files_per_batch`` files (as many rows as the source's)."""
    from halfmoon.spark.rows import SCHEMA_DDL

    stream = (
        spark.readStream.schema(SCHEMA_DDL)
        .option("maxFilesPerTrigger", str(files_per_batch))
        .parquet(parquet)
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
    return Result(
        "peer: spark parquet file read -> noop",
        rows,
        seconds,
        steady=steady_rate(query.recentProgress),
    )


def spark_stream_read(
    spark: Any, endpoint: str, topic: str, checkpoint: str, label: str, batch_rows: int
) -> Result:
    stream = (
        spark.readStream.format("halfmoon")
        .option("endpoint", endpoint)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", str(batch_rows))
        .options(**SOURCE_OPTIONS)
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
    return Result(label, rows, seconds, steady=steady_rate(query.recentProgress))


def spark_batch_read(spark: Any, endpoint: str, topic: str) -> Result:
    began = time.perf_counter()
    rows = (
        spark.read.format("halfmoon")
        .option("endpoint", endpoint)
        .option("topic", topic)
        .options(**SOURCE_OPTIONS)
        .load()
        .count()
    )
    return Result("spark batch read -> count()", rows, time.perf_counter() - began)


def spark_sink(
    spark: Any,
    endpoint: str,
    source: str,
    target: str,
    checkpoint: str,
    batch_rows: int,
    label: str = "spark sink (exactly-once, topic -> topic)",
) -> Result:
    stream = (
        spark.readStream.format("halfmoon")
        .option("endpoint", endpoint)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", str(batch_rows))
        .options(**SOURCE_OPTIONS)
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
    return Result(
        label,
        rows,
        seconds,
        steady=steady_rate(query.recentProgress),
    )


def register_python_floor(spark: Any, rows: int) -> str:
    """Register a Python data source that does nothing: a stream reader of ``rows`` constant
    rows in four partitions and a stream writer that counts them. A query through it costs
    what Spark's machinery for Python data sources costs (the planning process, the writer's
    commit, the offset log), with no broker and no work per row; its format name.

    The classes are made here, not at module level, so Spark's Python workers get them by
    value (cloudpickle) and need not import this benchmark."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        InputPartition,
        WriterCommitMessage,
    )

    per_partition = rows // 4

    class Reader(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {"offset": 0}

        def latestOffset(self) -> dict[str, int]:
            return {"offset": per_partition * 4}

        def partitions(self, start: dict, end: dict) -> list[InputPartition]:
            if start["offset"] >= end["offset"]:
                return []
            return [InputPartition(i) for i in range(4)]

        def read(self, partition: InputPartition) -> Any:
            row = (b"x" * 256,)
            for _ in range(per_partition):
                yield row

        def commit(self, end: dict) -> None:
            pass

    class Writer(DataSourceStreamWriter):
        def write(self, iterator: Any) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: list, batchId: int) -> None:
            pass

        def abort(self, messages: list, batchId: int) -> None:
            pass

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "python-floor"

        def schema(self) -> str:
            return "body binary"

        def streamReader(self, schema: Any) -> Reader:
            return Reader()

        def streamWriter(self, schema: Any, overwrite: bool) -> Writer:
            return Writer()

    spark.dataSource.register(Floor)
    return Floor.name()


def spark_python_floor(spark: Any, checkpoint: str, rows: int) -> Result:
    """The peer of a sink query's fixed cost: a query from a Python source to a Python sink
    that do nothing (:func:`register_python_floor`)."""
    source = register_python_floor(spark, rows)
    began = time.perf_counter()
    query = (
        spark.readStream.format(source)
        .load()
        .writeStream.format(source)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - began
    done = sum(p["numInputRows"] for p in query.recentProgress)
    return Result(f"peer: Python source -> Python sink doing nothing, {rows:,} rows", done, seconds)


def task_code_sink(endpoint: str, source: str, target: str) -> Result:
    """The sink's task and driver code (:func:`halfmoon.spark.sink.write_group`, then the commit
    protocol) over the topic's rows in this process, no Spark: the rows are read first
    (untimed), then written 100,000 per transaction group like the Spark scenario's
    micro-batches."""
    from halfmoon.spark.options import source_options
    from halfmoon.spark.sink import CommitProtocol, sink_options, write_group
    from halfmoon.spark.source import HalfmoonBatchReader, read_range

    options = source_options({"endpoint": endpoint, "topic": source}, streaming=False)
    batches: list[Any] = []
    for partition in HalfmoonBatchReader(options).partitions():
        batches.extend(
            b.select(["body", "keys"])
            for b in read_range(options, partition.range)  # type: ignore[attr-defined]
        )
    sink = sink_options({"endpoint": endpoint, "topic": target, "sinkId": "bench-task"})
    protocol = CommitProtocol(sink)
    began, rows, batch_id, chunk = time.perf_counter(), 0, 0, []
    for batch in [*batches, None]:
        if batch is not None:
            chunk.append(batch)
            if sum(b.num_rows for b in chunk) < 100_000:
                continue
        if not chunk:
            break
        group = f"bench-task:{batch_id}:run{os.getpid()}"
        rows += write_group(sink, "bench-task", batch_id, group, iter(chunk)).count
        protocol.commit("bench-task", batch_id, group, target)
        batch_id, chunk = batch_id + 1, []
    return Result("sink task code, no Spark, 1 process", rows, time.perf_counter() - began)


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


def ratio(rate: float, peer_rate: float) -> str:
    return f"{rate / peer_rate:.2f}x" if peer_rate and rate else "-"


def verdict(result: Result, target: int) -> str:
    """PASS/MISS on the steady rate (the wall rate when there was one micro-batch)."""
    rate = result.steady or result.per_second
    how = (
        f"{result.steady:,.0f} steady, {result.per_second:,.0f} wall"
        if result.steady
        else f"{result.per_second:,.0f} wall, one micro-batch"
    )
    return f"{'PASS' if rate >= target else 'MISS'} ({how})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Spark connector throughput beside the Python client"
    )
    parser.add_argument("--messages", type=int, default=400_000, help="messages read")
    parser.add_argument(
        "--batch-rows",
        type=int,
        default=100_000,
        help="rows per micro-batch of every stream (maxRecordsPerTrigger; the peer's files)",
    )
    parser.add_argument(
        "--sink-messages",
        type=int,
        default=100_000,
        help="messages the sink copies (a topic of their own)",
    )
    parser.add_argument("--size", type=int, default=256, help="body bytes (default 256)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--json", default=None, help="write the results to this file")
    parser.add_argument(
        "--pull-batch-size", default=None, help="the source's pullBatchSize (default: its own)"
    )
    parser.add_argument(
        "--sink-only",
        action="store_true",
        help="only the sink: its task code without Spark, then the Spark sink",
    )
    args = parser.parse_args(argv)
    if args.pull_batch_size:
        SOURCE_OPTIONS["pullBatchSize"] = str(args.pull_batch_size)

    from halfmoon.spark import build_session
    from halfmoon.spark.sink import MARKER_TOPIC

    results: list[Result] = []
    scratch = tempfile.TemporaryDirectory(prefix="halfmoon-spark-bench-")
    # The JVM starts first: forking it from a process with live grpc channels (the fill's, the
    # client scenarios') sometimes lost the child to grpc's fork handlers (JAVA_GATEWAY_EXITED).
    spark = build_session("halfmoon-spark-bench", args.master)
    spark.sparkContext.setLogLevel("ERROR")
    with HalfmoonServer(flush="async") as server:
        server.create_topic("bench-in", queues=QUEUES)
        server.create_topic("bench-out", queues=QUEUES, message_type="transaction")
        server.create_topic(MARKER_TOPIC, queues=1, message_type="transaction")
        server.create_topic("warmup", queues=QUEUES)
        server.create_topic("warmup-out", queues=QUEUES, message_type="transaction")
        server.create_topic("sink-in", queues=QUEUES)
        if not args.sink_only:
            log(f"filling bench-in with {args.messages:,} messages of {args.size} B")
            fill(server.grpc, "bench-in", args.messages, args.size)
        log(f"filling sink-in with {args.sink_messages:,} messages of {args.size} B")
        fill(server.grpc, "sink-in", args.sink_messages, args.size)
        fill(server.grpc, "warmup", 2000, args.size)

        def measured(run: Any) -> None:
            cpu, reader = cpu_seconds(server.pid), reader_cpu_seconds(server.pid)
            result = run()
            result.server_cpu = cpu_seconds(server.pid) - cpu
            result.reader_cpu = reader_cpu_seconds(server.pid) - reader
            results.append(result)
            log(f"{result.scenario}: {result.per_second:,.0f} msgs/s")

        parquet = f"{scratch.name}/parquet"
        if args.sink_only:
            scenarios: tuple[tuple[str, Any], ...] = (
                ("sink task", lambda: task_code_sink(server.grpc, "sink-in", "bench-task-out")),
            )
            server.create_topic("bench-task-out", queues=QUEUES, message_type="transaction")
        else:
            measured(lambda: asyncio.run(client_read(server.grpc, "bench-in", args.messages)))
            # The read path before BulkRead is slow: it reads the sink's (smaller) topic.
            measured(lambda: task_code_read(server.grpc, "sink-in", None))
            measured(
                lambda: task_code_read(
                    server.grpc, "bench-in", parquet, max(args.batch_rows // QUEUES, 1)
                )
            )
            scenarios = (
                (
                    "peer",
                    lambda: spark_parquet_read(
                        spark, parquet, f"{scratch.name}/parquet-noop", QUEUES
                    ),
                ),
                (
                    "stream",
                    lambda: spark_stream_read(
                        spark,
                        server.grpc,
                        "bench-in",
                        f"{scratch.name}/noop",
                        f"spark stream read -> noop ({args.master})",
                        args.batch_rows,
                    ),
                ),
                ("batch", lambda: spark_batch_read(spark, server.grpc, "bench-in")),
            )
        spark_stream_read(
            spark, server.grpc, "warmup", f"{scratch.name}/warm", "warm-up", 1000
        )  # JVM and workers warm
        # The sink's code paths warm too: its first query spent ~6 s more than the next ones
        # (JVM classes and code of the write path, the writer's Python workers).
        spark_sink(spark, server.grpc, "warmup", "warmup-out", f"{scratch.name}/sink-warm", 1000)
        spark_python_floor(spark, f"{scratch.name}/floor-warm", 2000)
        if not args.sink_only:  # the peer's code paths warm too
            spark_parquet_read(spark, parquet, f"{scratch.name}/parquet-warm", QUEUES)
        for _label, run in (
            *scenarios,
            ("python floor", lambda: spark_python_floor(spark, f"{scratch.name}/floor", 2000)),
            (
                "sink, fixed cost",
                lambda: spark_sink(
                    spark,
                    server.grpc,
                    "warmup",
                    "warmup-out",
                    f"{scratch.name}/sink-small",
                    args.batch_rows,
                    label="spark sink, 2,000 rows (a query's fixed cost)",
                ),
            ),
            (
                "sink",
                lambda: spark_sink(
                    spark,
                    server.grpc,
                    "sink-in",
                    "bench-out",
                    f"{scratch.name}/sink",
                    args.batch_rows,
                ),
            ),
        ):
            measured(run)
        spark.stop()
    scratch.cleanup()

    load = os.getloadavg()
    peer = next((r for r in results if r.scenario.startswith("peer: spark parquet")), None)
    peer_rate = peer.per_second if peer else 0.0
    peer_steady = peer.steady if peer else 0.0
    print(
        f"{'scenario':<52} {'messages':>9} {'seconds':>8} {'msgs/s':>9} {'vs parquet':>10} "
        f"{'steady/s':>9} {'vs parquet':>10} {'server CPU/msg':>14} {'reader CPU/msg':>14}"
    )
    print("-" * 143)
    for r in results:
        cpu = f"{r.server_cpu / r.messages * 1e6:.1f} us" if r.messages else "-"
        reader = f"{r.reader_cpu / r.messages * 1e6:.1f} us" if r.messages else "-"
        steady = (
            f"{r.steady:>9,.0f} {ratio(r.steady, peer_steady):>10}"
            if r.steady
            else (f"{'-':>9} {'-':>10}")
        )
        print(
            f"{r.scenario:<52} {r.messages:>9,} {r.seconds:>8.2f} {r.per_second:>9,.0f} "
            f"{ratio(r.per_second, peer_rate):>10} {steady} {cpu:>14} {reader:>14}"
        )
    print(
        "msgs/s: messages over the query's wall time (start to termination); steady/s: over the "
        f"execution time of its micro-batches after the first ({args.batch_rows:,} rows each)"
    )
    print(
        "reader CPU: this process and its descendants but the server (Spark's JVM and Python "
        "workers in the Spark rows)"
    )
    sink = next(r for r in results if r.scenario.startswith("spark sink (exactly-once"))
    sink_target = f"exactly-once sink >= {TARGET_SINK:,} msgs/s: {verdict(sink, TARGET_SINK)}"
    if args.sink_only:
        print(f"\ntarget: {sink_target}")
    else:
        stream = next(r for r in results if r.scenario.startswith("spark stream"))
        print(
            f"\ntarget: stream read into Spark (noop) >= {TARGET_READ:,} msgs/s: "
            f"{verdict(stream, TARGET_READ)}; {sink_target}; stream vs parquet "
            f"{ratio(stream.per_second, peer_rate)} (wall), "
            f"{ratio(stream.steady, peer_steady)} (steady)"
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
