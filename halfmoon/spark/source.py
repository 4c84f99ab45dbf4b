"""``spark.read`` / ``spark.readStream`` ``.format("halfmoon")``: a topic's committed messages as
rows.

Reading happens by offset, one Spark task per queue range, through
``halfmoon.v1.BulkRead`` (docs/bulk-read.md: thousands of messages per answer,
already columnar; PullMessage when the server predates it), so it never
disturbs the consumer groups of the applications (no receipt handles, no
redelivery). The broker serves only committed messages from a
topic's queues: half messages live in an internal topic until their
transaction commits, and a rollback never reaches the queue, so pending and
rolled-back transactions are never read.

Streaming: the driver keeps no state beyond the offsets Spark checkpoints.
Each trigger asks the route for the current queues (a queue added to the
topic is read from its start), and the broker for their end offsets;
admission control (``maxRecordsPerTrigger`` through Spark's ``ReadLimit``)
cuts the span, and ``Trigger.AvailableNow`` fixes the target at the start.
A restart resumes from the checkpointed end of the last batch: no gap, no
duplicate. With ``commitOffsets`` the end of each finished batch is stored
as the consumer group's offsets (for lag in ``halfmoon consumer progress``;
Spark's checkpoint remains the source of truth, as with Kafka).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from halfmoon.client.errors import Unsupported
from halfmoon.spark.options import (
    DataLossError,
    OffsetSpec,
    SourceOptions,
    selector_wire,
    source_options,
)
from halfmoon.spark.plan import Offsets, QueueRange, admit, resolve, split
from halfmoon.spark.rows import SCHEMA_DDL, record_batch, record_batch_of_columns
from halfmoon.spark.sink import HalfmoonBatchWriter, HalfmoonStreamWriter, sink_options
from halfmoon.spark.wire import Code, PendingBulkRead, Queue, Wire

log = logging.getLogger("halfmoon.spark.source")

# A range whose offsets exist (they are below the queue's end) may still answer "no message"
# for a moment after a broker restart; this bounds how long a task waits for them.
MISSING_RANGE_TIMEOUT = 30.0
# About this many bytes per BulkRead answer (and at most pullBatchSize messages).
READ_BYTES = 8 * 1024 * 1024
MAX_PULL_BATCH = 1024  # PullMessage's own limit
_LATEST = OffsetSpec("latest")


class RangePartition(InputPartition):
    """One task: offsets ``[start, end)`` of one queue."""

    def __init__(self, queue_range: QueueRange) -> None:
        super().__init__(queue_range)
        self.range = queue_range


def queues_of(wire: Wire, options: SourceOptions) -> list[Queue]:
    queues = [q for topic in options.topics for q in wire.queues(topic)]
    if options.queues is not None:
        queues = [q for q in queues if q.queue_id in options.queues]
    return queues


def offsets_for(wire: Wire, queues: Sequence[Queue], spec: OffsetSpec) -> Offsets:
    by_key = {(q.topic, q.queue_id): q for q in queues}

    def lookup(topic: str, queue_id: int, policy: str, timestamp_ms: int | None) -> int:
        return wire.query_offset(by_key[(topic, queue_id)], policy, timestamp_ms)

    return resolve(spec, list(by_key), lookup)


def read_range(options: SourceOptions, queue_range: QueueRange) -> Iterator[pa.RecordBatch]:
    """The committed messages of ``queue_range`` as Arrow record batches (runs in a task)."""
    wire = Wire(options.endpoint, options.credentials, tls=options.tls)
    queue = next(
        (q for q in wire.queues(queue_range.topic) if q.queue_id == queue_range.queue_id), None
    )
    if queue is None:
        raise DataLossError(
            f"queue {queue_range.queue_id} of topic {queue_range.topic!r} is gone; it had offsets "
            f"{queue_range.start} to {queue_range.end} left to read"
        )
    offset = _check_retention(wire, options, queue, queue_range.start, queue_range.end)
    if queue.endpoint in _NO_BULK_READ:
        yield from _pull_range(wire, options, queue, offset, queue_range.end)
        return
    try:
        yield from _bulk_range(wire, options, queue, offset, queue_range.end)
    except Unsupported as exc:
        if exc.rpc != "BulkRead":
            raise
        # A server without halfmoon.v1.BulkRead (older): the RocketMQ protocol's PullMessage.
        # The first call failed, so nothing was yielded yet.
        log.info("event=spark_bulk_read_unsupported endpoint=%s", queue.endpoint)
        _NO_BULK_READ.add(queue.endpoint)
        yield from _pull_range(wire, options, queue, offset, queue_range.end)


# Endpoints that answered BulkRead with UNIMPLEMENTED (per Python worker).
_NO_BULK_READ: set[str] = set()


def _bulk_range(
    wire: Wire, options: SourceOptions, queue: Queue, offset: int, end: int
) -> Iterator[pa.RecordBatch]:
    """``[offset, end)`` of ``queue`` through BulkRead: one record batch per answer.

    The next read is sent as soon as an answer says where it starts, before that answer's
    record batch is built and handed to Spark: the server reads while the task converts and
    Spark consumes, instead of each waiting for the other.
    """
    stalled = _Stall(queue, end)

    def start(at: int) -> PendingBulkRead:
        return wire.bulk_read_started(
            options.group, queue, at, end, options.pull_batch_size, READ_BYTES, options.filter
        )

    pending: PendingBulkRead | None = start(offset) if offset < end else None
    try:
        while pending is not None:
            answer = pending.answer()
            pending = None
            if answer.code == Code.ILLEGAL_OFFSET and answer.next_offset > offset:
                offset = _check_retention(wire, options, queue, offset, end)
                pending = start(offset) if offset < end else None
                continue
            if answer.next_offset > offset:
                offset = answer.next_offset
                stalled.clear()
                pending = start(offset) if offset < end else None
                if answer.count:
                    yield record_batch_of_columns(answer.columns, queue.queue_id)
                continue
            if answer.count:
                yield record_batch_of_columns(answer.columns, queue.queue_id)
            stalled.check(offset)
            wire.bulk_read(
                options.group, queue, offset, end, 1, READ_BYTES, options.filter, wait=1.0
            )
            pending = start(offset)
    finally:
        if pending is not None:  # the task stopped early (a limit, a failure): drop the read
            pending.cancel()


def _pull_range(
    wire: Wire, options: SourceOptions, queue: Queue, offset: int, end: int
) -> Iterator[pa.RecordBatch]:
    """``[offset, end)`` of ``queue`` through PullMessage (a server without BulkRead)."""
    selector = selector_wire(options.filter)
    stalled = _Stall(queue, end)
    while offset < end:
        want = min(options.pull_batch_size, MAX_PULL_BATCH, end - offset)
        answer = wire.pull(options.group, queue, offset, want, selector)
        if answer.code == Code.ILLEGAL_OFFSET and answer.next_offset > offset:
            offset = _check_retention(wire, options, queue, offset, end)
            continue
        rows = [m for m in answer.messages if m.system_properties.queue_offset < end]
        if rows:
            yield record_batch(rows)
        if answer.next_offset > offset:
            offset = answer.next_offset
            stalled.clear()
            continue
        stalled.check(offset)
        wire.pull(options.group, queue, offset, 1, selector, wait=1.0)


class _Stall:
    """Nothing at an offset below the queue's end: a restarting broker, waited for briefly;
    after MISSING_RANGE_TIMEOUT it is data loss."""

    def __init__(self, queue: Queue, end: int) -> None:
        self.queue, self.end = queue, end
        self.since: float | None = None

    def clear(self) -> None:
        self.since = None

    def check(self, offset: int) -> None:
        self.since = self.since or time.monotonic()
        if time.monotonic() - self.since > MISSING_RANGE_TIMEOUT:
            raise DataLossError(
                f"{self.queue.topic!r} queue {self.queue.queue_id} answers nothing at offset "
                f"{offset} (below its end {self.end}) for {MISSING_RANGE_TIMEOUT:.0f}s"
            )


def _check_retention(
    wire: Wire, options: SourceOptions, queue: Queue, offset: int, end: int
) -> int:
    """``offset``, or the queue's oldest kept offset when retention removed messages before it."""
    earliest = wire.query_offset(queue, "earliest")
    if earliest <= offset:
        return offset
    lost = min(earliest, end) - offset
    text = (
        f"{lost} messages of {queue.topic!r} queue {queue.queue_id} (offsets {offset} to "
        f"{min(earliest, end)}) "
        "were removed by retention before this query read them"
    )
    if options.fail_on_data_loss:
        raise DataLossError(
            text + "; set failOnDataLoss=false to skip them, or keep messages longer"
        )
    log.warning("event=spark_data_loss %s; skipped (failOnDataLoss=false)", text)
    return earliest


class HalfmoonBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        wire = Wire(self.options.endpoint, self.options.credentials, tls=self.options.tls)
        queues = queues_of(wire, self.options)
        start = offsets_for(wire, queues, self.options.starting)
        end = offsets_for(wire, queues, self.options.ending)
        return [
            RangePartition(r) for r in split(start, end, self.options.max_records_per_partition)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, RangePartition):  # Spark plans one empty partition for no ranges
            yield from read_range(self.options, partition.range)


class HalfmoonStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.target: Offsets | None = None  # Trigger.AvailableNow: never read past this

    def _wire(self) -> Wire:
        return Wire(self.options.endpoint, self.options.credentials, tls=self.options.tls)

    def _latest(self) -> Offsets:
        wire = self._wire()
        return offsets_for(wire, queues_of(wire, self.options), _LATEST)

    def initialOffset(self) -> dict:
        wire = self._wire()
        return offsets_for(wire, queues_of(wire, self.options), self.options.starting)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_records_per_trigger
        return ReadMaxRows(limit) if limit is not None else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest = self._latest()
        if self.target is not None:
            latest = {
                t: {
                    q: min(o, self.target.get(t, {}).get(q, start.get(t, {}).get(q, 0)))
                    for q, o in qs.items()
                }
                for t, qs in latest.items()
            }
        max_rows = getattr(limit, "max_rows", None) if isinstance(limit, ReadMaxRows) else None
        return admit(start, latest, max_rows)

    def reportLatestOffset(self) -> dict | None:
        return self._latest()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._latest()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [
            RangePartition(r) for r in split(start, end, self.options.max_records_per_partition)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, RangePartition):  # Spark plans one empty partition for no ranges
            yield from read_range(self.options, partition.range)

    def commit(self, end: dict) -> None:
        if not self.options.commit_offsets:
            return
        wire = self._wire()
        by_key = {(q.topic, str(q.queue_id)): q for q in queues_of(wire, self.options)}
        for topic, queues in end.items():
            for queue_id, offset in queues.items():
                queue = by_key.get((topic, queue_id))
                if queue is not None:
                    wire.commit_offset(self.options.group, queue, offset)


class HalfmoonDataSource(DataSource):
    """The ``halfmoon`` format: read topics, and write them exactly once (see
    :mod:`halfmoon.spark.sink`)."""

    @classmethod
    def name(cls) -> str:
        return "halfmoon"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return HalfmoonBatchReader(source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return HalfmoonStreamReader(source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool):  # type: ignore[no-untyped-def]
        return HalfmoonBatchWriter(sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool):  # type: ignore[no-untyped-def]
        return HalfmoonStreamWriter(sink_options(self.options), schema)
