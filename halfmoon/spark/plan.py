"""Offsets and partitions: where reads start and end, how much a trigger admits, how tasks split.

An offset is a JSON-able dict ``{topic: {queue_id: next offset to read}}``,
the form Spark keeps in its checkpoint's offset log. Queue offsets are
positions in the queue, not message counts: a tag or SQL92 filter skips
messages, so a range of N offsets yields *at most* N rows. That makes the
offset span a safe bound for admission control: ``maxRecordsPerTrigger``
limits the span, and so the rows.

Everything here is pure (the broker answers come in as plain dicts), so the
arithmetic is tested without Spark or a server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from halfmoon.spark.options import EARLIEST, LATEST, OffsetSpec, SparkOptionError

Offsets = dict[str, dict[str, int]]


@dataclass(frozen=True)
class QueueRange:
    """Offsets ``[start, end)`` of one queue: what one Spark task reads."""

    topic: str
    queue_id: int
    start: int
    end: int


def resolve(
    spec: OffsetSpec,
    queues: Iterable[tuple[str, int]],
    lookup: Callable[[str, int, str, int | None], int],
) -> Offsets:
    """The concrete offset of every queue for ``spec``.

    ``lookup(topic, queue_id, policy, timestamp_ms)`` asks the broker
    (``earliest``, ``latest`` or ``timestamp``). A JSON spec must name every
    queue read (as Kafka's source requires), with -2/-1 for earliest/latest.
    """
    out: Offsets = {}
    for topic, queue_id in queues:
        if spec.kind in ("earliest", "latest"):
            offset = lookup(topic, queue_id, spec.kind, None)
        elif spec.kind == "timestamp":
            offset = lookup(topic, queue_id, "timestamp", spec.timestamp_ms)
        else:
            assert spec.per_queue is not None
            given = spec.per_queue.get(topic, {}).get(str(queue_id))
            if given is None:
                raise SparkOptionError(
                    f"the offsets JSON names no offset for {topic!r} queue {queue_id}; "
                    "give every queue read (-2 = earliest, -1 = latest)"
                )
            if given == EARLIEST:
                offset = lookup(topic, queue_id, "earliest", None)
            elif given == LATEST:
                offset = lookup(topic, queue_id, "latest", None)
            elif given < 0:
                raise SparkOptionError(
                    f"offset {given} for {topic!r} queue {queue_id} is negative (use -2 or -1)"
                )
            else:
                offset = given
        out.setdefault(topic, {})[str(queue_id)] = offset
    return out


def admit(start: Offsets, latest: Offsets, max_records: int | None) -> Offsets:
    """The end offsets of the next micro-batch: ``latest``, or a span of at most ``max_records``.

    Queues missing from ``start`` (new queues) start at 0. With a limit, each
    queue gets a share proportional to its backlog (as Kafka's source does),
    rounded down, and what rounding leaves goes to the largest backlogs, so
    the batch reads exactly ``min(max_records, backlog)`` offsets and a small
    queue is never starved by a big one.
    """
    end: Offsets = {t: dict(q) for t, q in latest.items()}
    backlog = {
        (t, q): max(o - start.get(t, {}).get(q, 0), 0)
        for t, queues in latest.items()
        for q, o in queues.items()
    }
    total = sum(backlog.values())
    if max_records is None or total <= max_records:
        return _never_backwards(start, end)
    shares = {key: lag * max_records // total for key, lag in backlog.items()}
    left = max_records - sum(shares.values())
    for key in sorted(backlog, key=lambda k: backlog[k] - shares[k], reverse=True):
        if left <= 0:
            break
        if shares[key] < backlog[key]:
            shares[key] += 1
            left -= 1
    for (t, q), share in shares.items():
        end[t][q] = start.get(t, {}).get(q, 0) + share
    return _never_backwards(start, end)


def _never_backwards(start: Offsets, end: Offsets) -> Offsets:
    # A queue the route no longer lists keeps its position; none goes back.
    for topic, queues in start.items():
        for queue, offset in queues.items():
            target = end.setdefault(topic, {})
            target[queue] = max(target.get(queue, offset), offset)
    return end


def split(start: Offsets, end: Offsets, max_per_task: int) -> list[QueueRange]:
    """The tasks reading ``[start, end)``: one per queue, long ranges cut into ``max_per_task``."""
    ranges = []
    for topic in sorted(end):
        for queue in sorted(end[topic], key=int):
            low, high = start.get(topic, {}).get(queue, 0), end[topic][queue]
            while low < high:
                upper = min(low + max_per_task, high)
                ranges.append(QueueRange(topic, int(queue), low, upper))
                low = upper
    return ranges


def span(start: Offsets, end: Offsets) -> int:
    """How many offsets lie between ``start`` and ``end`` (an upper bound on the rows)."""
    return sum(
        max(o - start.get(t, {}).get(q, 0), 0)
        for t, queues in end.items()
        for q, o in queues.items()
    )
