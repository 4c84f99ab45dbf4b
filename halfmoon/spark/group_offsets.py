"""The sink commits the source's consumer-group offsets in each batch's transaction.

With the sink option ``sourceGroup``, the driver's commit of micro-batch N
registers, in the batch's data transaction group, the end offsets of N for
every halfmoon source of the query as ``sourceGroup``'s committed offsets
(halfmoon's transactional UpdateOffset). The group commit then publishes the
batch's rows and moves the offsets in one atomic decision, so
``halfmoon consumer progress`` shows exactly what the pipeline wrote, not one
batch behind (the source's ``commitOffsets`` runs when the next batch starts).

Where the offsets come from: Spark writes each batch's source offsets to the
checkpoint's offset log (``<checkpointLocation>/offsets/<N>``: a version line,
a metadata line, then one JSON line per source) before running the batch.
A halfmoon source's line is ``{"topic": {"queue id": offset}}``; lines of
other sources are skipped. The checkpoint must be on the driver's local
file system (a ``file:`` path or a plain path).

Spark's checkpoint stays the source of truth for the query: the offsets are
registered with ``expected`` = the group's committed offset read just before,
so the commit is never fenced by the query itself.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from halfmoon.spark.wire import Queue, Wire

log = logging.getLogger("halfmoon.spark.group_offsets")

Offsets = dict[str, dict[str, int]]


def batch_offsets(checkpoint: str, batch_id: int) -> list[Offsets]:
    """The end offsets of batch ``batch_id`` of every source that looks like a halfmoon source."""
    path = Path(checkpoint.removeprefix("file:")) / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        log.warning("event=spark_offset_log_unreadable path=%s error=%s", path, error)
        return []
    found = []
    for line in lines[2:]:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and all(
            isinstance(queues, dict)
            and all(isinstance(q, str) and isinstance(o, int) for q, o in queues.items())
            for queues in value.values()
        ):
            found.append(value)
    return found


def _queues(wire: Wire, offsets: list[Offsets]) -> list[tuple[Queue, int]]:
    chosen = []
    for source in offsets:
        for topic, queues in source.items():
            by_id = {str(q.queue_id): q for q in wire.queues(topic)}
            chosen += [(by_id[q], o) for q, o in queues.items() if q in by_id]
    return chosen


def register_in_group(
    wire: Wire, transaction_group: str, consumer_group: str, checkpoint: str, batch_id: int
) -> int:
    """Register batch ``batch_id``'s end offsets in ``transaction_group``; how many queues."""
    queues = _queues(wire, batch_offsets(checkpoint, batch_id))
    for queue, offset in queues:
        committed = wire.committed_offset(consumer_group, queue)
        wire.commit_offset_in_group(
            transaction_group, consumer_group, queue, offset, -1 if committed is None else committed
        )
    return len(queues)


def commit_plainly(wire: Wire, consumer_group: str, checkpoint: str, batch_id: int) -> None:
    """A batch that wrote no row: nothing to pair the offsets with, store them at once."""
    for queue, offset in _queues(wire, batch_offsets(checkpoint, batch_id)):
        wire.commit_offset(consumer_group, queue, offset)
