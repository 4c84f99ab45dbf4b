"""``df.write`` / ``df.writeStream`` ``.format("halfmoon")``: rows as messages, exactly once.

Columns: ``body`` (binary or string, required), ``topic`` (else the ``topic``
option), ``keys`` (array of strings, or one string), ``tag``, ``properties``
(map of strings), ``message_group``. The target topic must accept
transactional messages (type ``transaction`` or ``mixed``).

The protocol (docs/spark.md has the failure cases worked through):

* Each micro-batch run is **one transaction group** ``<sink>:<batch>:<run>``
  (``run`` is fresh each time the query starts). Every task sends its rows as
  half messages of that group: nothing is visible yet.
* The driver's ``commit(batch)`` first records the decision durably on the
  broker: one *commit marker* (a half message naming the data group) in
  the marker group ``<sink>:<batch>``, which it commits. That group decision
  is the commit point of the batch: the broker keeps it in its op log,
  repeating it is a no-op, and a half message sent to a decided group is
  refused. Then the driver commits the data group (one atomic decision for
  all rows) and returns, and Spark writes its own commit log.
* If the driver dies after the commit point but before Spark's commit log,
  Spark replays the batch on restart. The replay's rows go to a new data
  group; its marker is refused (the marker group is decided), so the driver
  reads the committed marker back, commits the data group it names (again:
  a no-op when that already happened) and rolls back the replay's group.
  Consumers see each row once.
* If several markers joined the marker group before its commit (a run died
  after sending its marker but before committing it), they are committed
  together; the first one in the marker queue wins, for every reader.
* ``abort`` (a task failed) rolls the data group back. A task retry would
  append to a group that holds a failed attempt's rows, so a retried task
  fails at once and Spark aborts the batch (the query fails and resumes from
  its checkpoint on restart); speculative execution must stay off.

Group members are not checked by the broker (their owner decides), so a
run that died before its commit point leaves an undecided data group. With
the ``admin`` option (the admin API's URL) the driver clears them itself:
after committing batch N it lists the data topic's pending transactions,
and rolls back every group ``<sink>:<b>:<run>`` with ``b <= N`` written by
another application that no committed marker of ``<sink>:<b>`` names (see
``OrphanSweep``). Without it, ``halfmoon transaction list`` shows them until
an operator rolls the group back (docs/spark.md).

Batch writes (``df.write``) are one transaction group per job, committed by
the driver when every task succeeded and rolled back otherwise.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from halfmoon import failpoints
from halfmoon.client.credentials import Credentials
from halfmoon.client.errors import ClientError
from halfmoon.client.message import Message, born_host, message_ids
from halfmoon.errors import HalfmoonError
from halfmoon.spark.group_offsets import commit_plainly, register_in_group
from halfmoon.spark.half_wire import HalfEncoder
from halfmoon.spark.options import (
    SparkOptionError,
    TlsOptions,
    credentials_of,
    endpoint_of,
    option_value,
    selector_wire,
    tls_of,
)
from halfmoon.spark.wire import Queue, Wire, admin_ssl_context, group_decided, pb

log = logging.getLogger("halfmoon.spark.sink")

MARKER_TOPIC = "halfmoon-spark-commits"
PROPERTY_MARKER = "hm_spark_marker"  # "<sink>:<batch>" on a commit marker
PROPERTY_DATA_GROUP = "hm_spark_group"  # the data group a marker commits
SINK_GROUP = "halfmoon-spark-sink"  # the consumer group marker reads are made as
MARKER_TIMEOUT = 30.0
ORPHAN_LIST_LIMIT = 10_000  # pending transactions read per sweep; the oldest (orphans) come first
ADMIN_TIMEOUT = 10.0
# Half messages per SendMessage: past ~1,000 the per-call cost is gone, and the server appends
# a batch of a known group on its event loop (~30 ms for 1,024), so larger would hold up
# other clients for longer without saving more.
SEND_CHUNK = 1024
SEND_CHUNK_BYTES = 3 * 1024 * 1024
_SINK_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class SinkError(HalfmoonError):
    """The sink cannot write: a column is missing or of the wrong type, or a task was retried."""

    code = "SPARK_SINK_ERROR"
    protocol_code = "INTERNAL_ERROR"


@dataclass(frozen=True)
class SinkOptions:
    endpoint: str
    topic: str | None
    sink_id: str | None
    marker_topic: str
    admin: str | None = None  # admin API URL: when set, the driver rolls back dead runs' groups
    # Consumer group whose offsets each batch's transaction commits (group_offsets.py).
    source_group: str | None = None
    checkpoint: str | None = None
    credentials: Credentials | None = None  # repr leaves the secret out
    tls: TlsOptions | None = None


@dataclass
class SinkCommit(WriterCommitMessage):
    """What a task tells the driver: the sink and batch, the group it wrote into, how many
    messages."""

    sink: str
    batch: int
    group: str
    count: int
    partition: int


def sink_options(options: Mapping[str, str]) -> SinkOptions:
    sink_id = option_value(options, "sinkId") or _checkpoint_query_id(
        option_value(options, "checkpointLocation")
    )
    if sink_id is not None and not _SINK_ID.match(sink_id):
        raise SparkOptionError(
            f"option sinkId must be 1 to 64 letters, digits, '_', '.' or '-', got {sink_id!r}"
        )
    source_group = (option_value(options, "sourceGroup") or "").strip() or None
    checkpoint = option_value(options, "checkpointLocation")
    if source_group is not None and not checkpoint:
        raise SparkOptionError(
            "option sourceGroup needs the query's checkpointLocation: the batch's source "
            "offsets are read from its offset log"
        )
    return SinkOptions(
        endpoint=endpoint_of(options),
        source_group=source_group,
        checkpoint=checkpoint,
        topic=(option_value(options, "topic") or "").strip() or None,
        sink_id=sink_id,
        marker_topic=(option_value(options, "markerTopic") or MARKER_TOPIC).strip(),
        admin=_admin_url(option_value(options, "admin")),
        credentials=credentials_of(options),
        tls=tls_of(options),
    )


def _admin_url(value: str | None) -> str | None:
    if value is None or not value.strip():
        return None
    parsed = urllib.parse.urlsplit(value.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise SparkOptionError(
            f"option admin must be the admin API's URL, http(s)://HOST:PORT, got {value!r}"
        )
    return value.strip().rstrip("/")


def _checkpoint_query_id(location: str | None) -> str | None:
    # Spark keeps the query's id in <checkpoint>/metadata; it survives restarts, as a sink id must.
    if not location:
        return None
    path = Path(location.removeprefix("file:")) / "metadata"
    try:
        return str(json.loads(path.read_text().splitlines()[0])["id"])
    except (OSError, ValueError, KeyError, IndexError):
        return None


# -- tasks -------------------------------------------------------------------------------


def _encoded_rows(
    batch: pa.RecordBatch, default_topic: str | None, encoder: HalfEncoder
) -> Iterator[tuple[str, bytes]]:
    """(topic, encoded half message) per row, column by column: no per-row objects."""
    names = set(batch.schema.names)
    if "body" not in names:
        raise SinkError(
            "the halfmoon sink needs a 'body' column (binary or string); select or alias one"
        )
    if "topic" not in names and default_topic is None:
        raise SinkError("no target topic: add a 'topic' column or set the option topic")

    def column(name: str) -> Iterable[object]:
        return batch.column(name).to_pylist() if name in names else repeat(None, batch.num_rows)

    next_id = message_ids.next
    for body, topic, keys, tag, properties, message_group in zip(
        column("body"),
        column("topic"),
        column("keys"),
        column("tag"),
        column("properties"),
        column("message_group"),
        strict=True,
    ):
        if body is None:
            raise SinkError("a row has a null body; filter such rows out or give them a body")
        if not isinstance(body, bytes):
            body = str(body).encode()
        if not body:
            raise SinkError("a row has an empty body; halfmoon refuses empty messages")
        topic = topic or default_topic
        if not topic:
            raise SinkError("a row has no topic: give it one or set the option topic")
        yield (
            topic,  # type: ignore[misc]
            encoder.encode(
                topic,  # type: ignore[arg-type]
                body,
                next_id(),
                [keys] if isinstance(keys, str) else keys or (),  # type: ignore[arg-type]
                tag,  # type: ignore[arg-type]
                {str(k): str(v) for k, v in properties} if properties else None,  # type: ignore[attr-defined]
                message_group,  # type: ignore[arg-type]
            ),
        )


def write_group(
    options: SinkOptions, sink: str, batch_id: int, group: str, batches: Iterator[pa.RecordBatch]
) -> SinkCommit:
    """Send every row of a task as a half message of ``group`` (runs in a Spark task).

    Rows go out in requests of up to ``SEND_CHUNK`` messages or ``SEND_CHUNK_BYTES`` per
    topic, encoded straight from the Arrow columns (:mod:`half_wire`).
    """
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    if context is not None and context.attemptNumber() > 0:
        raise SinkError(
            f"task for partition {partition} is a retry (attempt {context.attemptNumber()}): its "
            "earlier attempt "
            "may have sent rows into the same transaction group, so the batch is aborted instead; "
            "the query resumes from its checkpoint when restarted"
        )
    wire = Wire(options.endpoint, options.credentials, tls=options.tls)
    encoder = HalfEncoder(group, born_host(), int(time.time() * 1000))
    count = 0
    pending: dict[str, tuple[list[bytes], int]] = {}  # topic -> (encoded messages, bytes)

    def send(topic: str) -> None:
        nonlocal count
        chunk, _ = pending.pop(topic)
        wire.send_encoded_halves(b"".join(chunk), len(chunk))
        count += len(chunk)

    for batch in batches:
        for topic, encoded in _encoded_rows(batch, options.topic, encoder):
            chunk, size = pending.get(topic) or ([], 0)
            chunk.append(encoded)
            pending[topic] = (chunk, size + len(encoded))
            if len(chunk) >= SEND_CHUNK or size + len(encoded) >= SEND_CHUNK_BYTES:
                send(topic)
    for topic in list(pending):
        send(topic)
    return SinkCommit(sink, batch_id, group, count, partition)


# -- driver: the commit protocol ---------------------------------------------------------


class CommitProtocol:
    """The driver's side for one sink: markers, group decisions, replays (see the module doc)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.wire = Wire(options.endpoint, options.credentials, tls=options.tls)
        self.orphans_rolled_back: list[str] = []  # by the last commit's sweep

    def marker_queue(self) -> Queue:
        try:
            queues = self.wire.queues(self.options.marker_topic)
        except ClientError as exc:
            raise SinkError(
                f"the commit-marker topic {self.options.marker_topic!r} is missing ({exc}); create "
                "it once: "
                f"halfmoon topic create {self.options.marker_topic} --type transaction --queues 1"
            ) from None
        return queues[0]

    def commit(self, sink: str, batch_id: int, data_group: str, topic: str) -> str:
        """Commit batch ``batch_id`` written into ``data_group``; returns the data group that
        won."""
        key = f"{sink}:{batch_id}"
        queue = self.marker_queue()
        marker = Message(
            self.options.marker_topic,
            json.dumps({"sink": sink, "batch": batch_id, "group": data_group}).encode(),
            tag=marker_tag(key),
            keys=[key],
            properties={PROPERTY_MARKER: key, PROPERTY_DATA_GROUP: data_group},
        )
        try:
            self.wire.send_halves([marker], key)
            read_from = self.wire.query_offset(queue, "latest")
            self.wire.end_group(key, self.options.marker_topic, commit=True)  # the commit point
            failpoints.spark_sink("after-marker-commit")
        except ClientError as exc:
            if group_decided(exc) != "committed":
                raise
            log.info("event=spark_sink_replay sink=%s batch=%d", sink, batch_id)
            read_from = self.wire.query_offset(queue, "earliest")
        winner = self.committed_group(queue, key, read_from)
        self.wire.end_group(winner, topic, commit=True)
        if winner != data_group:
            self.wire.end_group(data_group, topic, commit=False)
        if self.options.admin is not None:
            self.orphans_rolled_back = OrphanSweep(self, queue).run(
                sink, batch_id, data_group, topic
            )
        return winner

    def committed_group(self, queue: Queue, key: str, offset: int) -> str:
        """The data group named by the first committed marker of ``key`` at or after ``offset``.

        The broker publishes a committed message into its queue just after the
        decision returns, so the marker may take a moment to appear: read on,
        long-polling, until it does or ``MARKER_TIMEOUT`` passes.
        """
        selector = _marker_selector(key)
        deadline = time.monotonic() + MARKER_TIMEOUT
        while time.monotonic() < deadline:
            answer = self.wire.pull(SINK_GROUP, queue, offset, 1024, selector, wait=1.0)
            for message in answer.messages:
                if message.user_properties.get(PROPERTY_MARKER) == key:
                    return message.user_properties[PROPERTY_DATA_GROUP]
            offset = max(offset, answer.next_offset)
        raise SinkError(
            f"batch {key} is committed on the broker but its commit marker did not appear in "
            f"{self.options.marker_topic!r} within {MARKER_TIMEOUT:.0f}s; the batch is retried "
            "when the query restarts"
        )

    def named_groups(self, queue: Queue, key: str) -> set[str]:
        """Every data group a committed marker of ``key`` names (reads the marker queue once, no
        waiting)."""
        selector = _marker_selector(key)
        offset, end = (
            self.wire.query_offset(queue, "earliest"),
            self.wire.query_offset(queue, "latest"),
        )
        named: set[str] = set()
        while offset < end:
            answer = self.wire.pull(SINK_GROUP, queue, offset, 1024, selector)
            named |= {
                m.user_properties[PROPERTY_DATA_GROUP]
                for m in answer.messages
                if m.user_properties.get(PROPERTY_MARKER) == key
            }
            if answer.next_offset <= offset:
                break
            offset = answer.next_offset
        return named

    def abort(self, data_group: str, topic: str) -> None:
        try:
            self.wire.end_group(data_group, topic, commit=False)
        except ClientError as exc:
            if group_decided(exc) != "committed":
                raise


class OrphanSweep:
    """Roll back the undecided data groups that runs of this sink left when they died before their
    commit point.

    Runs on the driver just after batch N committed. A pending group
    ``<sink>:<b>:<run>`` is an orphan when ``b <= N`` (Spark finished or
    replaced batch b: every later run of b went into a group of its own) and
    it was written by another application (``run`` starts with the
    application's submit time, so the current run's groups are never
    touched) and no committed marker of ``<sink>:<b>`` names it (that group
    is the batch's output: it is committed, never rolled back). Finding the
    groups needs the admin API's list of pending transactions; the gRPC
    protocol has no such listing. A failed sweep is logged and retried at
    the next commit: the batch itself is already committed.
    """

    def __init__(self, protocol: CommitProtocol, marker_queue: Queue) -> None:
        self.protocol = protocol
        self.marker_queue = marker_queue

    def run(self, sink: str, batch_id: int, data_group: str, topic: str) -> list[str]:
        """Roll back the orphans of ``sink`` up to ``batch_id``; returns the groups rolled back."""
        try:
            return self._sweep(sink, batch_id, data_group, topic)
        except (OSError, ValueError, KeyError, TypeError, HalfmoonError) as exc:
            log.warning(
                "event=spark_sink_orphan_sweep_failed sink=%s batch=%d error=%s",
                sink,
                batch_id,
                exc,
            )
            return []

    def _sweep(self, sink: str, batch_id: int, data_group: str, topic: str) -> list[str]:
        current_app = _run_application(data_group)
        candidates: dict[str, int] = {}
        for group in self._pending_groups(None if topic == "-" else topic):
            parts = group.split(":")
            if len(parts) != 3 or parts[0] != sink or not parts[1].isdigit():
                continue  # another sink's group, or a batch write (<sink>:<uuid>)
            if int(parts[1]) <= batch_id and _run_application(group) != current_app:
                candidates[group] = int(parts[1])
        rolled_back = []
        named: dict[int, set[str]] = {}
        for group, batch in sorted(candidates.items()):
            if batch not in named:
                named[batch] = self.protocol.named_groups(self.marker_queue, f"{sink}:{batch}")
            if group in named[batch]:
                continue  # the batch's output: whoever replays the batch commits it
            self.protocol.abort(group, topic)
            rolled_back.append(group)
            log.info(
                "event=spark_sink_orphan_rolled_back sink=%s batch=%d group=%s", sink, batch, group
            )
        return rolled_back

    def _pending_groups(self, topic: str | None) -> set[str]:
        query = {"limit": str(ORPHAN_LIST_LIMIT), **({"topic": topic} if topic else {})}
        options = self.protocol.options
        url = f"{options.admin}/v1/transactions?{urllib.parse.urlencode(query)}"
        headers = {"accept": "application/json"}
        if options.credentials is not None:  # the admin API takes the same users
            pair = f"{options.credentials.access_key}:{options.credentials.secret_key}"
            headers["authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        request = urllib.request.Request(url, headers=headers)
        context = admin_ssl_context(options.tls) if url.startswith("https:") else None
        with urllib.request.urlopen(request, timeout=ADMIN_TIMEOUT, context=context) as answer:
            transactions = json.loads(answer.read())["transactions"]
        return {t["transaction_group"] for t in transactions if t.get("transaction_group")}


def _run_application(group: str) -> str:
    # A stream run is "<submit time>s<stage>": the submit time names the application.
    return group.rpartition(":")[2].partition("s")[0]


def marker_tag(key: str) -> str:
    return "m." + key.replace(":", ".")


def _marker_selector(key: str) -> pb.FilterExpression | None:
    return selector_wire(("TAG", marker_tag(key)))


def log_to_driver() -> None:
    """Make this process's sink events reach the Spark driver's log.

    Spark runs a Python data source's ``commit`` and ``abort`` not in the
    application's Python process but in a Python worker the driver's JVM
    starts, whose stderr the JVM copies to its own: the driver's log (in local
    mode, the application's terminal). That worker configures no logging, so
    Python would drop the INFO events (replays, orphans rolled back, commits).
    Called only from those driver-side methods; a handler the process already
    has is kept.
    """
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        log.addHandler(handler)


# -- the writers Spark calls ---------------------------------------------------------------


class HalfmoonStreamWriter(DataSourceStreamArrowWriter):
    """Each micro-batch: one transaction group, committed once even across driver crashes.

    Spark builds separate writer objects for the tasks and for the driver's
    commit, so nothing is shared through ``self``: tasks name the group from
    the micro-batch's task properties (query id, batch id, application start
    and stage) and report it in their commit messages; the driver commits
    what they report.
    """

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self.options = options
        self.topic = options.topic or "-"
        CommitProtocol(
            options
        ).marker_queue()  # fail when the query starts, not at its first commit

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        context = TaskContext.get()
        batch_id = (
            context.getLocalProperty("streaming.sql.batchId") if context is not None else None
        )
        sink = self.options.sink_id or (
            context.getLocalProperty("sql.streaming.queryId") if context is not None else None
        )
        if context is None or batch_id is None or sink is None:
            raise SinkError(
                "the halfmoon stream writer ran outside a streaming micro-batch (no batch id in "
                "the task)"
            )
        # Unique to this run of the batch and shared by its tasks: the application's start time
        # and the write stage.
        run = f"{context.getLocalProperty('spark.app.submitTime') or 0}s{context.stageId()}"
        return write_group(self.options, sink, int(batch_id), f"{sink}:{batch_id}:{run}", iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commits = [m for m in messages if isinstance(m, SinkCommit)]
        source_group, checkpoint = self.options.source_group, self.options.checkpoint
        if not commits:  # no task ran: nothing was written
            if source_group is not None and checkpoint is not None:
                commit_plainly(
                    Wire(self.options.endpoint, self.options.credentials, tls=self.options.tls),
                    source_group,
                    checkpoint,
                    batchId,
                )
            return
        groups = {m.group for m in commits}
        if len(groups) != 1:
            raise SinkError(
                f"batch {batchId} was written into several transaction groups {sorted(groups)}; "
                "refusing to commit"
            )
        group = groups.pop()
        log_to_driver()
        protocol = CommitProtocol(self.options)
        if source_group is not None and checkpoint is not None:
            # The source's offsets join the batch's data group: committed with its rows.
            register_in_group(protocol.wire, group, source_group, checkpoint, batchId)
        failpoints.spark_sink("before-marker")
        winner = protocol.commit(commits[0].sink, batchId, group, self.topic)
        rows = sum(m.count for m in commits)
        # One line per batch with what an operator asks after a restart: was this a
        # replay, and how many dead runs' groups did the sweep roll back.
        log.info(
            "event=spark_sink_commit sink=%s batch=%d group=%s rows=%d replay=%s "
            "orphans_rolled_back=%d",
            commits[0].sink,
            batchId,
            winner,
            rows,
            str(winner != group).lower(),
            len(protocol.orphans_rolled_back),
        )
        failpoints.spark_sink("after-broker-commit")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log_to_driver()
        protocol = CommitProtocol(self.options)
        for group in {m.group for m in messages if isinstance(m, SinkCommit)}:
            protocol.abort(group, self.topic)


class HalfmoonBatchWriter(DataSourceArrowWriter):
    """``df.write``: one transaction group for the whole job, named when the job is planned."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self.options = options
        self.sink = options.sink_id or "batch"
        self.group = f"{self.sink}:{uuid.uuid4().hex}"
        self.topic = options.topic or "-"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return write_group(self.options, self.sink, 0, self.group, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        wire = Wire(self.options.endpoint, self.options.credentials, tls=self.options.tls)
        for group in {m.group for m in messages if isinstance(m, SinkCommit)}:
            wire.end_group(group, self.topic, commit=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        wire = Wire(self.options.endpoint, self.options.credentials, tls=self.options.tls)
        for group in {m.group for m in messages if isinstance(m, SinkCommit)} | {self.group}:
            wire.end_group(group, self.topic, commit=False)


__all__ = ["MARKER_TOPIC", "HalfmoonBatchWriter", "HalfmoonStreamWriter", "SinkCommit", "SinkError"]
