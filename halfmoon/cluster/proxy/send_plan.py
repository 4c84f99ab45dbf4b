"""Where a proxy puts each message of a send: its queue, hence its broker.

A message without a queue gets one here, as a broker would pick it
(:func:`halfmoon.broker.queue_select.queue_for_group`): a lite message by the
CRC-32 of its lite topic, a FIFO message by the CRC-32 of its message group (a
group always on one queue), any other round-robin over the
topic's writable queues (docs/cluster.md, "Sends"). A message without a
message group whose broker does not take sends (down, or drained) is steered
to a queue of one that does, round-robin too.

The round-robin is one counter per topic (RocketMQ's producer keeps one per
topic too), so receives and other topics' sends do not skew a topic's spread.
A send's plan may be made twice: first on the event loop from what the proxy
already knows, then again on a worker thread when that needed a blocking
answer (:class:`NeedsThread`). Its draws are kept by message (:class:`Draws`)
and the second plan reuses them: drawing again would skip a queue per
message, and over a topic placed a,b,a,b two draws per send land every send
on one broker.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace

from halfmoon.broker.errors import IllegalQueueId
from halfmoon.broker.message import OutgoingMessage
from halfmoon.broker.queue_select import queue_for_group
from halfmoon.cluster.coordination.placement import QueueAssignment
from halfmoon.cluster.proxy.routing import Layout

# Topics whose counters a proxy keeps; past it they start again (a spread, not an order).
ROTATIONS_KEPT = 4096

# A message of a send, planned: its index in the call, itself on its broker's queue, its layout.
Planned = tuple[int, OutgoingMessage, Layout]

# Why a message drew: the queue it asked for, or the queue it was steered to.
_PICK, _STEER = 0, 1


class NeedsThread(Exception):
    """Planning a send on the loop needs a blocking call: the send goes to a thread."""


class Rotation:
    """A round-robin counter per (topic, purpose); safe from any thread (one draw is one
    ``next`` on an ``itertools.count``, which the interpreter does atomically)."""

    def __init__(self) -> None:
        self._counters: dict[tuple[str, int], itertools.count[int]] = {}

    def draw(self, topic: str, purpose: int) -> int:
        counter = self._counters.get((topic, purpose))
        if counter is None:
            if len(self._counters) >= ROTATIONS_KEPT:
                self._counters.clear()
            counter = self._counters.setdefault((topic, purpose), itertools.count())
        return next(counter)


class Draws:
    """One send call's round-robin draws, by message: a plan made again reuses them."""

    def __init__(self, rotation: Rotation) -> None:
        self._rotation = rotation
        self._made: dict[tuple[int, int], int] = {}

    def draw(self, index: int, topic: str, purpose: int) -> int:
        made = self._made.get((index, purpose))
        if made is None:
            made = self._made[(index, purpose)] = self._rotation.draw(topic, purpose)
        return made


def plan_sends(
    messages: Sequence[OutgoingMessage],
    layout_of: Callable[[str], Layout],
    takes_sends: Callable[[str], bool],
    draws: Draws,
) -> dict[str, list[Planned]]:
    """The messages split by broker, each with its queue on that broker.

    ``layout_of`` and ``takes_sends`` may raise :class:`NeedsThread`; the caller plans
    again elsewhere with the same ``draws``."""
    parts: dict[str, list[Planned]] = {}
    for index, message in enumerate(messages):
        layout = layout_of(message.topic)
        queue_id = message.queue_id
        if message.lite_topic is not None:
            # A lite topic lives on one broker (its store topic, its order, its count
            # against that broker's lite limits): the queue follows the lite topic's name.
            queue_id = queue_for_group(message.lite_topic, layout.writable)
        elif queue_id is None or layout.writable <= queue_id < len(layout.queues):
            # A queue removed by a shrink takes no more sends (a client's stale route).
            queue_id = _pick_queue(index, message, layout.writable, draws)
        where = layout.locate(queue_id)
        if where is None:
            raise IllegalQueueId(
                f"topic {message.topic!r} has no queue {queue_id} "
                f"(queues 0..{len(layout.queues) - 1})"
            )
        if not (message.message_group or message.lite_topic) and not takes_sends(where.broker):
            where = _steer(index, layout, where, takes_sends, draws)
        if message.queue_id != where.broker_queue:
            message = replace(message, queue_id=where.broker_queue)
        parts.setdefault(where.broker, []).append((index, message, layout))
    return parts


def _pick_queue(index: int, message: OutgoingMessage, queue_count: int, draws: Draws) -> int:
    if message.message_group:
        return queue_for_group(message.message_group, queue_count)
    return draws.draw(index, message.topic, _PICK) % queue_count


def _steer(
    index: int,
    layout: Layout,
    chosen: QueueAssignment,
    takes_sends: Callable[[str], bool],
    draws: Draws,
) -> QueueAssignment:
    """A queue on a broker that takes sends instead of ``chosen``, whose broker does not.

    Only for messages without a message group: their queue carries no meaning, and a
    client retrying the same queue (as the official Python client does) would otherwise
    fail until its next route refresh. A FIFO message keeps its queue (its order)."""
    live = [q for q in layout.queues if q.queue_id < layout.writable and takes_sends(q.broker)]
    if not live:
        return chosen  # nothing better: the send fails with BROKER_UNAVAILABLE
    return live[draws.draw(index, layout.topic, _STEER) % len(live)]
