"""The broker's own counters on the process's metrics registry (``/metrics``).

Counted where the thing happens, in the broker's domain code: messages stored per
topic; per group and topic, deliveries, redeliveries (a delivery attempt after the
first), acknowledgements; dead letters per group; and the end-to-end latency of
first deliveries (store-side now minus the producer's born time). Each hook is a
dictionary look-up and an addition under one lock per batch, not per message:
the send path pays one ``inc_key`` per topic of a send.

Numbers that already live elsewhere (pending transactions, queue offsets, lag)
are read at scrape time by the admin API's collector instead.

In cluster mode the broker processes count and serve no HTTP: a proxy asks each
broker for :func:`snapshot` (the facade's ``counted_metrics``) at scrape time and
renders it with a ``broker`` label (:func:`families_of`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from halfmoon.broker.message import MessageView
from halfmoon.metrics import MetricFamily, default_registry

_REGISTRY = default_registry()
MESSAGES_IN = _REGISTRY.counter(
    "halfmoon_topic_messages_in_total", "Messages stored into each topic.", ("topic",)
)
MESSAGES_OUT = _REGISTRY.counter(
    "halfmoon_group_messages_out_total",
    "Messages delivered to each consumer group from each topic (redeliveries included).",
    ("group", "topic"),
)
REDELIVERED = _REGISTRY.counter(
    "halfmoon_group_messages_redelivered_total",
    "Deliveries after the first of the same message (an expired invisibility or a nack).",
    ("group", "topic"),
)
ACKED = _REGISTRY.counter(
    "halfmoon_group_messages_acked_total",
    "Messages acknowledged by each consumer group in each topic.",
    ("group", "topic"),
)
DEAD_LETTERS = _REGISTRY.counter(
    "halfmoon_dead_letters_total",
    "Messages moved to a group's dead-letter topic after their last delivery attempt.",
    ("group",),
)
END_TO_END = _REGISTRY.histogram(
    "halfmoon_end_to_end_latency_seconds",
    "From the producer's born time to the first delivery to each group.",
    ("group",),
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 3600),
)


def stored(topic: str, count: int) -> None:
    MESSAGES_IN.inc_key((topic,), count)


def delivered(group: str, topic: str, count: int) -> None:
    """Messages handed to ``group`` (a receive's or a pull's)."""
    if count > 0:
        MESSAGES_OUT.inc_key((group, topic), count)


def received(group: str, topic: str, views: Sequence[MessageView]) -> None:
    """A receive's deliveries: redeliveries counted, first ones timed end to end."""
    if not views:
        return
    again = 0
    now_ms = time.time() * 1000
    group_key = (group,)
    for view in views:
        if view.delivery_attempt > 1:
            again += 1
        elif view.born_timestamp:
            END_TO_END.observe_key(group_key, max(0.0, now_ms - view.born_timestamp) / 1000)
    if again:
        REDELIVERED.inc_key((group, topic), again)


def acked(group: str, topic: str, count: int = 1) -> None:
    if count > 0:
        ACKED.inc_key((group, topic), count)


def dead_lettered(group: str) -> None:
    DEAD_LETTERS.inc_key((group,))


def snapshot() -> list[list[Any]]:
    """The counted families as plain lists (``[name, kind, help, [[labels, value], ...]]``),
    for the internal protocol."""
    out: list[list[Any]] = []
    for metric in (MESSAGES_IN, MESSAGES_OUT, REDELIVERED, ACKED, DEAD_LETTERS, END_TO_END):
        family = metric.family()
        out.append(
            [
                family.name,
                family.kind,
                family.help,
                [[dict(labels), v] for labels, v in family.samples],
            ]
        )
    return out


def families_of(snapshot: Iterable[Sequence[Any]], **labels: str) -> list[MetricFamily]:
    """A :func:`snapshot` back as metric families, every sample given ``labels`` too."""
    families = []
    for name, kind, help, samples in snapshot:
        family = MetricFamily(str(name), str(kind), str(help))
        family.samples = [({**labels, **dict(have)}, float(value)) for have, value in samples]
        families.append(family)
    return families
