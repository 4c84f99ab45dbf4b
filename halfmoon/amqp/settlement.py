"""A channel's delivery tags and its unacked deliveries: tracked, taken, settled.

Delivery tags are the channel's, from 1 (no-ack deliveries take a tag too and
are not tracked). Basic.Ack, Nack and Reject name a tag (or every tag up to
one, with ``multiple``); :meth:`Settlement.take` finds the deliveries that
settles (406 for an unknown tag, or one already settled in the open
transaction), :meth:`Settlement.settle` applies it: now, or registered with
the channel's transaction. A requeue returns the message at once; a reject
without requeue drops it, or dead-letters it when its queue has a
dead-letter exchange (:mod:`halfmoon.amqp.dead_letter`). When the channel
closes, :meth:`Settlement.return_all` puts every unacked delivery back.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from halfmoon.amqp.consumer import Consumer
from halfmoon.amqp.dead_letter import REJECTED, has_dead_letter_exchange
from halfmoon.amqp.reply_codes import PRECONDITION_FAILED, AmqpChannelError
from halfmoon.amqp.topology import Queue
from halfmoon.broker.message import MessageView

if TYPE_CHECKING:
    from halfmoon.amqp.channel import Channel


@dataclass(slots=True)
class Delivery:
    tag: int
    queue: Queue
    handle: str
    consumer: Consumer | None
    view: MessageView | None = None  # kept for dead-lettering (its body and properties)


class Settlement:
    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self.unacked: OrderedDict[int, Delivery] = OrderedDict()  # by tag, increasing
        self._next_tag = 1

    def next_tag(self) -> int:
        """A tag for a delivery that needs no settling (no-ack)."""
        tag = self._next_tag
        self._next_tag += 1
        return tag

    def track(self, queue: Queue, view: MessageView, consumer: Consumer | None) -> int:
        tag = self.next_tag()
        assert view.receipt_handle is not None
        # The message itself is kept only where a reject would dead-letter it.
        kept = view if has_dead_letter_exchange(queue) else None
        self.unacked[tag] = Delivery(tag, queue, view.receipt_handle, consumer, kept)
        if consumer is not None:
            consumer.unacked += 1
        return tag

    def take(self, tag: int, multiple: bool, class_method: tuple[int, int]) -> list[Delivery]:
        """The deliveries an ack/nack/reject of ``tag`` settles (406 for an unknown tag)."""
        transaction = self._channel.transaction
        pending = transaction.settled_tags if transaction is not None else set()
        if multiple:
            if tag == 0:
                return [d for t, d in self.unacked.items() if t not in pending]
            # Tags are tracked in increasing order: the scan stops at the first one past
            # ``tag`` rather than walking every delivery of a large prefetch on each ack.
            taken: list[Delivery] = []
            for t, d in self.unacked.items():
                if t > tag:
                    break
                if t not in pending:
                    taken.append(d)
            return taken
        found = self.unacked.get(tag)
        if found is None or tag in pending:
            raise AmqpChannelError(
                PRECONDITION_FAILED, f"unknown delivery tag {tag}", *class_method
            )
        return [found]

    def forget(self, deliveries: list[Delivery]) -> None:
        for d in deliveries:
            if self.unacked.pop(d.tag, None) is not None and d.consumer is not None:
                d.consumer.unacked -= 1
        for consumer in self._channel.consumers.values():
            consumer.credit_freed()

    async def settle(self, deliveries: list[Delivery], requeue: bool | None) -> None:
        """Ack (``requeue`` None), requeue (True) or reject (False: dead-lettered when its
        queue has a dead-letter exchange, else dropped), now or in the transaction."""
        if not deliveries:
            return
        channel = self._channel
        if channel.transaction is not None:
            await channel.transaction.settle(deliveries, requeue)
            return
        self.forget(deliveries)
        server = channel.server
        if requeue is False:
            leaving = [(d.queue, d.view) for d in deliveries if d.view is not None]
            await server.dead_letters.move(
                channel.vhost, leaving, REJECTED, int(time.time() * 1000)
            )
            deliveries = [d for d in deliveries if d.view is None]
        by_queue: dict[str, list[str]] = {}
        for d in deliveries:
            by_queue.setdefault(d.queue.stored, []).append(d.handle)
        for stored, handles in by_queue.items():
            if requeue:
                await server.queues.requeue(stored, handles)
                server.arrivals.notify(stored)
            else:
                await server.queues.ack(stored, handles)

    async def return_all(self) -> None:
        """The channel closed: every unacked delivery back to its queue."""
        pending, self.unacked = list(self.unacked.values()), OrderedDict()
        by_queue: dict[str, list[str]] = {}
        for d in pending:
            by_queue.setdefault(d.queue.stored, []).append(d.handle)
        server = self._channel.server
        for stored, handles in by_queue.items():
            await server.queues.requeue(stored, handles)
            server.arrivals.notify(stored)
