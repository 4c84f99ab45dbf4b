"""A channel's transaction (Tx.Select): one halfmoon transaction group per Tx.Commit.

Publishes, acks, nacks and rejects are kept with the channel until Tx.Commit
(as RabbitMQ keeps them), routed and checked at the call (an unknown exchange
is 404 then, an unknown delivery tag 406). Tx.Commit hands them to the broker
in one job (:meth:`halfmoon.amqp.queues.Queues.tx_commit`): the publishes are
stored as half messages of a transaction group, the settles registered with
it, and the group ended with ``commit``, whose one op record is the commit
point; so every publish and every settle of the transaction applies together,
across queues and across a broker crash, or none does. Commit-Ok goes out once
that record and the members are durable, which one fsync covers. A commit the
broker refuses (a delivery that timed out and went to another consumer) rolls
the group back: nothing of it applies. Tx.Rollback (and a channel closed with a
transaction open) forgets what was kept: nothing of it reached the broker; the
deliveries stay unacked (rollback does not requeue, as in RabbitMQ), then
return to their queues when the channel closes. A reject without requeue of a
message whose queue has a dead-letter exchange adds its dead-lettered copies
to the group's members: they appear at commit with the rest, or never.

Length limits apply at Tx.Commit, as RabbitMQ applies them then
(:func:`halfmoon.amqp.length_limit.admit_in_order`): a publish to a
``reject-publish`` queue becomes a member only if it fits its queue then,
counting the transaction's earlier ones (a ``reject-publish-dlx`` queue's
refused one adds its dead-lettered copies instead); ``drop-head`` queues are
trimmed once the commit applied (a crash between the two leaves the queue
over its limit until its next publish trims it).

A no-ack Basic.Get inside a transaction is an ack of the transaction
(:meth:`Transaction.take`): the message is taken only if the transaction
commits; rolled back, it goes back to its queue at once (the client holds no
delivery tag it would ack).
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from halfmoon.amqp import dead_letter, length_limit
from halfmoon.amqp.dead_letter import REJECTED, Original
from halfmoon.amqp.message import outgoing, priority_in
from halfmoon.amqp.queues import TxSettle
from halfmoon.amqp.reply_codes import PRECONDITION_FAILED, AmqpChannelError
from halfmoon.amqp.topology import Queue
from halfmoon.broker.message import OutgoingMessage
from halfmoon.errors import HalfmoonError

if TYPE_CHECKING:
    from halfmoon.amqp.channel import Channel
    from halfmoon.amqp.settlement import Delivery

log = logging.getLogger("halfmoon.amqp")


@dataclass(slots=True)
class Held:
    """A publish to a ``reject-publish`` queue: a member at commit if it fits."""

    queue: Queue
    message: OutgoingMessage
    original: Original


class Transaction:
    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._prefix = f"amqp-{channel.client_id}-{secrets.token_hex(4)}"
        self._count = 0
        self._begin()

    def _begin(self) -> None:
        self._count += 1
        self.group_id = f"{self._prefix}-{self._count}"
        self.members: list[OutgoingMessage] = []  # stored at commit, as the group's members
        self.settles: list[TxSettle] = []  # registered with the group at commit
        self.settled: list[tuple[Delivery, bool]] = []  # (delivery, requeued)
        self.settled_tags: set[int] = set()
        self.taken: list[Delivery] = []  # no-ack gets: back to their queue unless committed
        self.held: list[Held] = []
        self.to_trim: list[Queue] = []  # drop-head queues published to

    @property
    def empty(self) -> bool:
        return not self.members and not self.settles and not self.held

    async def publish(
        self,
        targets: list[Queue],
        original: Original,
        envelope: str,
        priority: object = None,
        delay: int | None = None,
    ) -> None:
        """Keep a publish for the commit. ``delay`` (``x-delay``, ms): delivered that long after
        the publish and not before the commit (committed, it waits in its queue)."""
        due = int(time.time() * 1000) + delay if delay else None
        for q in targets:
            message = outgoing(
                q.stored,
                original.body,
                envelope,
                transaction_group=self.group_id,
                delivery_timestamp=due,
                priority=priority_in(q, priority),
            )
            if length_limit.refuses_when_full(q):
                self.held.append(Held(q, message, original))
                continue
            if length_limit.capped(q) and not any(t is q for t in self.to_trim):
                self.to_trim.append(q)
            self.members.append(message)

    async def _admit_held(self) -> None:
        """The held publishes that fit their queues now become members, and for those a
        ``reject-publish-dlx`` queue refuses, their dead-lettered copies."""
        held, self.held = self.held, []
        if not held:
            return
        channel = self._channel
        fits = await length_limit.admit_in_order(
            channel.server.queues, [(h.queue, len(h.original.body)) for h in held]
        )
        now = int(time.time() * 1000)
        for h, fit in zip(held, fits, strict=True):
            if fit:
                self.members.append(h.message)
            else:
                self.members += length_limit.refusal_copies(
                    channel.vhost, [h.queue], h.original, now, self.group_id
                )

    async def _trim(self, queues: list[Queue]) -> None:
        """The drop-head queues the commit published to, back to their limits. The commit
        applied already: a failure here is logged, not the commit's."""
        channel = self._channel
        server = channel.server
        for queue in queues:
            try:
                await length_limit.trim(
                    server.queues, server.dead_letters, channel.vhost, queue, channel.client_id
                )
            except HalfmoonError as exc:
                log.info("event=amqp_trim_failed queue=%s code=%s", queue.stored, exc.code)

    async def settle(self, deliveries: list[Delivery], requeue: bool | None) -> None:
        """An ack (``requeue`` None), requeue (True) or reject (False) of each, at commit; a
        rejected message's dead-lettered copies are members of the group too."""
        channel = self._channel
        now = int(time.time() * 1000)
        for d in deliveries:
            if requeue is False and d.view is not None:
                self.members += dead_letter.copies(
                    channel.vhost, d.queue, Original.of(d.view), REJECTED, now, self.group_id
                )
            self.settles.append(TxSettle(d.queue.stored, d.handle, bool(requeue)))
            self.settled.append((d, bool(requeue)))
            self.settled_tags.add(d.tag)

    async def take(self, delivery: Delivery) -> None:
        """A no-ack Basic.Get: acked with the transaction, returned if it does not commit."""
        await self.settle([delivery], requeue=None)
        self.taken.append(delivery)

    async def _return_taken(self) -> None:
        taken = self.taken
        if not taken:
            return
        self._channel.settlement.forget(taken)
        queues = self._channel.server.queues
        for stored in {d.queue.stored for d in taken}:
            await queues.requeue(stored, [d.handle for d in taken if d.queue.stored == stored])
            self._channel.server.arrivals.notify(stored)

    async def commit(self) -> None:
        if self.empty:
            return
        settled, to_trim = self.settled, self.to_trim
        try:
            await self._admit_held()
            if self.empty:  # held publishes only, every one refused: nothing to commit
                self._begin()
                return
            await self._channel.server.queues.tx_commit(self.group_id, self.members, self.settles)
        except HalfmoonError as exc:
            await self._return_taken()
            self._begin()
            raise AmqpChannelError(
                PRECONDITION_FAILED,
                f"transaction rolled back: {exc.message} ({exc.code}); nothing of it applied",
                90,
                20,
            ) from None
        self._begin()
        await self._trim(to_trim)
        self._channel.settlement.forget([d for d, _ in settled])
        for stored in {d.queue.stored for d, requeued in settled if requeued}:
            self._channel.server.arrivals.notify(stored)

    async def rollback(self) -> None:
        """Nothing of the transaction reached the broker: forgetting it is the rollback."""
        await self._return_taken()
        self._begin()

    async def abandon(self) -> None:
        """The channel closes with the transaction open: roll it back."""
        self._begin()
