"""The broker facade's messaging role: send, consume by pop (receive, ack), lite
topics, consume by pull with offsets (see :mod:`halfmoon.broker.facade`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from halfmoon.broker.facade_types import Answer, PullResult
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.lite import OffsetOption, UnsubscribeNotifier
from halfmoon.broker.message import MessageView, OutgoingMessage, Received
from halfmoon.broker.produce import SendResult


class Messaging(Protocol):
    """Producing and consuming."""

    # -- produce ----------------------------------------------------------------------

    def send(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        """Validate every message (one bad one: nothing stored) and store them.

        Returns once the promise holds: written, and under the ``sync`` flush
        policy durable. Half messages (type TRANSACTION) are stored invisible
        and get a transaction id; delay messages wait in the timer and get a
        recall handle.
        """
        ...

    def send_nowait(self, messages: Sequence[OutgoingMessage]) -> Answer[list[SendResult]]:
        """As :meth:`send`, the one form each implementation writes (``send`` waits for it).

        Returns at once, on an event loop too: a :class:`Written` when the send only
        appended (every topic exists, no transaction group member needs an index lookup),
        else a :class:`Pending` that writes when asked for (a topic to create, a lookup, a
        broker a network hop away). Awaited, either is the results once durable."""
        ...

    def send_fanout(self, message: OutgoingMessage, others: Sequence[str]) -> list[SendResult]:
        """Send ``message`` to its topic and to each topic of ``others`` as one message: one
        message id, a queue per topic picked as :meth:`send` picks it, one result per topic
        (the message's own first), each with its own queue offset. Validated as one
        :meth:`send` of a copy per topic (one bad: nothing stored); a topic named twice is
        ``INVALID_ARGUMENT``. Returns once durable as :meth:`send` does.

        A broker stores it as one record indexed into every queue it holds of them
        (``Store.append_fanout``), so a fanout to N queues writes the message once. What
        one record cannot hold (a half message, a delay message still waiting, a lite
        message, an operator's resend) is stored as a message per topic. Across brokers
        (cluster mode) each broker stores it once for the topics it holds."""
        ...

    def send_fanout_nowait(
        self, message: OutgoingMessage, others: Sequence[str]
    ) -> Answer[list[SendResult]]:
        """As :meth:`send_fanout`, answered as :meth:`send_nowait` answers."""
        ...

    def recall(self, topic: str, recall_handle: str) -> str:
        """Cancel a delay message before its delivery time; its message id. Durable on return;
        again is a no-op. IllegalRecallHandle (garbled, forged, another topic's) or
        RecallTooLate."""
        ...

    # -- consume by pop -----------------------------------------------------------------

    def receive(
        self,
        group: str,
        topic: str,
        filter: FilterSpec,
        batch_size: int,
        invisible_ms: int,
        client_id: str = "",
        queue_id: int | None = None,
        holder: str = "",
    ) -> list[MessageView]:
        """Up to ``batch_size`` messages hidden for ``invisible_ms`` (0: the default); [] if none.

        ``queue_id`` receives from that queue only (IllegalQueueId if the topic
        has no such readable queue). Each carries a receipt handle for ack /
        change_invisible_duration /
        forward_to_dead_letter. FIFO groups get at most one message group's
        next message per queue at a time.

        ``holder`` (not on lite topics): who holds the deliveries, when only it can
        settle them (an AMQP channel's, through a cluster proxy: the proxy's lease).
        They go back to the queue, redelivered, as soon as the broker hears that the
        holder ended, and a broker restart keeps them hidden while it lasts; a change of
        invisible time ends the hold. "" holds nothing: a restart makes them visible.
        """
        ...

    def receive_nowait(
        self,
        group: str,
        topic: str,
        filter: FilterSpec,
        batch_size: int,
        invisible_ms: int,
        client_id: str = "",
        queue_id: int | None = None,
        holder: str = "",
    ) -> Answer[Received]:
        """:meth:`receive` without blocking: :class:`Written` when it can block neither on a
        lock nor on the disk, else :class:`Pending` (write it on a worker thread).

        Cheap enough for an event loop: reads of the page cache, bookkeeping in
        memory and, when it delivers, one append to the commit log's mapping (the
        deliveries' journal record, as :meth:`ack_nowait` appends). When it finds
        nothing, ``next_wakeup_ms`` is :meth:`next_wakeup_ms`'s answer, so a long poll
        parks without another call. Pending (its write the plain :meth:`receive`,
        :func:`~halfmoon.broker.facade.received_by_calls`) when the group's state is
        busy with another call, a delivery is due again (redelivery may dead-letter),
        the group trails a queue far enough that the read may come from disk, the topic
        or group would be created, or the broker is remote.
        """
        ...

    def next_wakeup_ms(self, group: str, topic: str, client_id: str = "") -> int | None:
        """When a message of ``topic`` next becomes visible to ``group`` again (epoch ms).

        For a lite parent topic: over the lite topics ``client_id`` subscribes to.
        """
        ...

    def ack(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None:
        """Consumed: never deliver it again. InvalidReceiptHandle for a stale or bad handle.

        On a lite parent topic, ``lite_topic`` names the lite topic (None: the one the
        receipt handle names); likewise for the two calls below.
        """
        ...

    def ack_nowait(
        self, group: str, topic: str, receipt_handles: Sequence[str]
    ) -> Answer[list[Exception | None]]:
        """Ack a batch of handles of an ordinary topic without blocking.

        ``result``: per handle None (acked) or the error :meth:`ack` would have
        raised; a :class:`Written` answer's ``durable`` completes once the batch's
        ack record is durable as the flush policy says (the acks answer only then;
        its error is each acked handle's answer). :class:`Pending` (nothing acked
        yet; its write acks each handle with :meth:`ack`,
        :func:`~halfmoon.broker.facade.acked_each`) when the group's state is busy
        with another call, the topic is a lite parent, or the broker is remote. A
        Written answer is bookkeeping in memory and one append to the commit log's
        mapping: an event loop may call it.
        """
        ...

    def change_invisible_duration(
        self,
        group: str,
        topic: str,
        receipt_handle: str,
        invisible_ms: int,
        lite_topic: str | None = None,
    ) -> str:
        """Hide the message ``invisible_ms`` from now; the new receipt handle (the old one dies)."""
        ...

    def forward_to_dead_letter(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None:
        """Move the message to the group's dead-letter topic now."""
        ...

    # -- lite topics (RIP-83) -----------------------------------------------------------

    def sync_lite_subscription(
        self,
        client_id: str,
        group: str,
        topic: str,
        action: str,
        lite_topics: Sequence[str],
        offset: OffsetOption | None = None,
    ) -> list[str]:
        """Apply a consumer's SyncLiteSubscription (partial_add / partial_remove /
        complete_add / complete_remove) to lite parent ``topic``; its lite topics after."""
        ...

    def list_lite_topics(self, topic: str) -> list[dict[str, object]]:
        """The lite topics of lite parent ``topic``, with their queue offsets."""
        ...

    def client_terminated(self, client_id: str) -> None:
        """A client said goodbye: its lite subscriptions end with it."""
        ...

    def lite_subscriptions(self, topic: str) -> list[dict[str, object]]:
        """Every consumer client's lite subscriptions under lite parent ``topic``."""
        ...

    def delete_lite_topic(self, topic: str, lite_topic: str) -> int:
        """Delete a lite topic; its subscribers are told. How many subscribers were told."""
        ...

    def set_lite_unsubscribe_notifier(self, notifier: UnsubscribeNotifier | None) -> None:
        """Who tells a client that one of its lite subscriptions was dropped (None: nobody)."""
        ...

    # -- consume by pull (offsets) ---------------------------------------------------------

    def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        batch_size: int,
        filter: FilterSpec,
    ) -> PullResult:
        """Read from one queue at ``offset``; no consumer state changes."""
        ...

    def bulk_read(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        filter: FilterSpec,
        end_offset: int | None = None,
    ) -> PullResult:
        """:meth:`pull` for bulk readers (Spark, halfmoon's PullConsumer): up to
        ``max_messages`` (1 to 16,384) and about ``max_bytes`` (1 B to 16 MiB; at least one
        message) of the queue's messages from ``offset``, none at or past ``end_offset``
        (None: no end; ``next_offset`` never passes it). No consumer state changes."""
        ...

    def get_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset; OffsetNotFound when it has none."""
        ...

    def update_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Commit an offset (0 to the queue's max offset)."""
        ...

    def query_offset(
        self, topic: str, queue_id: int, policy: str, timestamp: int | None = None
    ) -> int:
        """``beginning`` (min offset), ``end`` (max offset) or ``timestamp`` (first stored
        at/after)."""
        ...

    def reset_offset(self, group: str, topic: str, timestamp: int) -> dict[int, int]:
        """Move the group (pull offsets and pop position) to ``timestamp`` in every queue."""
        ...

    def seek_group(self, group: str, topic: str, offsets: Mapping[int, int]) -> dict[int, int]:
        """Move the group (pull offsets and pop position) to ``offsets[queue]`` in the named
        queues (deliveries in flight there die); the offsets applied. Every offset is checked
        first (IllegalOffset outside a queue's retained range): none moves unless all can."""
        ...
