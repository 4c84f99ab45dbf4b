"""A proxy's sends: each message placed on its queue, hence its broker (send_plan.py), and
each broker's part sent through that broker's connection.

A send is planned on the event loop from what the proxy already knows (the view's
placement, the writability the pool keeps fresh); when that needs a broker's answer
first, the whole call goes to a worker thread, with the draws already made.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from halfmoon.broker.errors import TopicNotFound
from halfmoon.broker.facade_types import Pending
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.broker.produce import SendResult, fanout_copies
from halfmoon.cluster.internal.send import metrics as send_metrics
from halfmoon.cluster.proxy.broker_pool import BrokerPool
from halfmoon.cluster.proxy.cluster_topics import ClusterTopics
from halfmoon.cluster.proxy.routing import Layout, qualify, unqualify
from halfmoon.cluster.proxy.send_plan import Draws, NeedsThread, Planned, Rotation, plan_sends

LAYOUTS_CACHED = 4096  # topics whose send layout a proxy keeps built


class ClusterSends:
    """Sends and recalls over the pool's brokers, with cluster queue ids and handles."""

    def __init__(self, pool: BrokerPool, topics: ClusterTopics) -> None:
        self.pool = pool
        self.topics = topics  # an unknown topic may be created on its first send
        self._rotation = Rotation()  # sends' round-robin, per topic
        # topic -> (the view's placement it was built from, the layout): sends on the loop
        self._layouts: dict[str, tuple[object, Layout]] = {}

    # -- produce -------------------------------------------------------------------------------

    def send_nowait(self, messages: Sequence[OutgoingMessage]) -> Pending[list[SendResult]]:
        """A send made when its answer is asked for: awaited on the proxy's event loop,
        :meth:`send_async`; written off one (a worker thread), :meth:`send`. Each broker
        answers once durable."""
        return Pending.of_durable(partial(self.send, messages), partial(self.send_async, messages))

    def send(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        return self._send_drawn(messages, Draws(self._rotation))

    def _send_drawn(self, messages: Sequence[OutgoingMessage], draws: Draws) -> list[SendResult]:
        """``send`` with the round-robin draws a plan on the event loop made before it found
        it needed a thread (reused: one draw per message, see send_plan.py)."""
        parts = plan_sends(messages, self._send_layout, self._takes_sends, draws)
        results: list[SendResult | None] = [None] * len(messages)
        for broker, part in parts.items():
            answers = self.pool.broker(broker).send([message for _, message, _ in part])
            for (index, _, layout), result in zip(part, answers, strict=True):
                results[index] = _qualified_result(broker, layout, result)
        return [result for result in results if result is not None]

    async def send_async(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        """``send`` on the proxy's event loop: each broker's part through its stream sender.

        Planned from what the proxy already knows (the view's placement, the writability
        the pool keeps fresh); when that needs a broker's answer first (a topic etcd does
        not place, a writability not known), the whole call goes to a worker thread as
        ``send``, with the draws already made."""
        draws = Draws(self._rotation)
        try:
            parts = plan_sends(messages, self._placed_layout, self._takes_sends_now, draws)
        except NeedsThread:
            send_metrics.planned("thread")
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, self._send_drawn, messages, draws)
        send_metrics.planned("loop")
        results: list[SendResult | None] = [None] * len(messages)

        async def send_part(broker: str, part: list[Planned]) -> None:
            answers = await self.pool.broker(broker).send_async([message for _, message, _ in part])
            for (index, _, layout), result in zip(part, answers, strict=True):
                results[index] = _qualified_result(broker, layout, result)

        if len(parts) == 1:
            [(broker, part)] = parts.items()
            await send_part(broker, part)
        else:
            await asyncio.gather(*(send_part(b, p) for b, p in parts.items()))
        return [result for result in results if result is not None]

    def send_fanout(self, message: OutgoingMessage, others: Sequence[str]) -> list[SendResult]:
        """Stored once per broker: the topics' queues are planned as a send's are, and each
        broker gets one fanout of the copies it holds on one queue id (an AMQP queue's
        topic has one queue, so one call per broker); with one message id for all."""
        copies = fanout_copies(message, others)
        if (
            not others
            or message.message_type is MessageType.TRANSACTION
            or message.lite_topic is not None
            or message.resent_from is not None
        ):
            return self.send(copies)  # one message per topic (see Broker.send_fanout)
        parts = plan_sends(copies, self._send_layout, self._takes_sends, Draws(self._rotation))
        results: list[SendResult | None] = [None] * len(copies)
        for broker, part in parts.items():
            by_queue: dict[int | None, list[Planned]] = {}
            for planned in part:
                by_queue.setdefault(planned[1].queue_id, []).append(planned)
            for runs in by_queue.values():
                first = runs[0][1]
                answers = self.pool.broker(broker).send_fanout(
                    first, [m.topic for _, m, _ in runs[1:]]
                )
                for (index, _, layout), result in zip(runs, answers, strict=True):
                    results[index] = _qualified_result(broker, layout, result)
        return [result for result in results if result is not None]

    def _send_layout(self, topic: str) -> Layout:
        """The topic's layout for a send; an unknown topic is created when the cluster's
        settings say so (``broker.auto_create_topics``), as local mode does."""
        layout = self.pool.layout(topic)
        if not layout.queues and self.topics.auto_create(topic) is not None:
            layout = self.pool.layout(topic)
        if not layout.queues:
            raise TopicNotFound(topic)
        return layout

    def _placed_layout(self, topic: str) -> Layout:
        """The topic's layout from the view alone (cached while its placement is the same)."""
        placed = self.pool.view.topic(topic)
        if placed is None:
            raise NeedsThread  # not placed by etcd: the brokers are asked (probe)
        cached = self._layouts.get(topic)
        if cached is not None and cached[0] is placed:
            return cached[1]
        layout = Layout(topic, placed.queues, placed.writable)
        if not layout.queues:
            raise TopicNotFound(topic)
        if len(self._layouts) >= LAYOUTS_CACHED:
            self._layouts.clear()
        self._layouts[topic] = (placed, layout)
        return layout

    def _takes_sends_now(self, broker: str) -> bool:
        if not self.pool.is_reachable(broker):
            return False
        writable = self.pool.writable_known(broker)
        if writable is None:
            raise NeedsThread  # not known: asking blocks
        return writable

    def _takes_sends(self, broker: str) -> bool:
        return self.pool.is_reachable(broker) and self.pool.is_writable(broker)

    def recall(self, topic: str, recall_handle: str) -> str:
        broker, own = unqualify(recall_handle, "recall handle")
        return self.pool.broker(broker).recall(topic, own)


def _qualified_result(broker: str, layout: Layout, result: SendResult) -> SendResult:
    return replace(
        result,
        queue_id=layout.cluster_queue(broker, result.queue_id),
        transaction_id=qualify(broker, result.transaction_id) if result.transaction_id else None,
        recall_handle=qualify(broker, result.recall_handle) if result.recall_handle else None,
    )
