"""Dead-lettering (``x-dead-letter-exchange``, ``x-dead-letter-routing-key``), as RabbitMQ does it.

A message leaves a queue that has a dead-letter exchange as a copy published
to that exchange when it is rejected or nacked without requeue (reason
``rejected``), found expired (``expired``), or pushed out by the queue's
length limit: dropped from the head, or refused with ``x-overflow =
reject-publish-dlx`` (``maxlen``). The copy is routed with the queue's
``x-dead-letter-routing-key``, else the routing key it was published with.
Without a dead-letter exchange, or when the exchange routes nowhere or does
not exist, the message is dropped, as in RabbitMQ.

The copy's headers get RabbitMQ's ``x-death``: an array of tables, one per
(queue, reason), most recent first, each with ``queue``, ``reason``,
``count``, ``exchange`` and ``routing-keys`` (where it was published),
``time`` and, when it expired by its own ``expiration``,
``original-expiration``. Dying again in the same queue for the same reason
increments that entry's ``count`` and moves it to the front.
``x-first-death-queue`` / ``-reason`` / ``-exchange`` are set once,
``x-last-death-*`` every time. The copy's ``expiration`` is removed (it would
expire again at once); the target queue's ``x-message-ttl`` applies anew.

Cycles: a copy that would reach a queue its ``x-death`` already names, with
no ``rejected`` death on the way (only expiry or length limits moved it), is
not delivered there: RabbitMQ drops such a cycle too, so a queue that
dead-letters expired messages into itself does not loop forever. A client's
reject breaks the cycle (retry-by-TTL topologies keep working).

Crash safety: a copy and the removal of its original are one halfmoon
transaction group (:meth:`DeadLetters.move`): the copies are stored as
invisible members of the group, the original's ack is registered with it,
and the group's commit record is the point where both happen. A broker crash
before that record leaves the original where it was (unacked, hidden until
its delivery timeout; the group rolls back) and no copy; after it, the copy
is visible and the original gone. Nothing is lost or doubled. A
``reject-publish-dlx`` copy has no original to remove: it is a plain send,
confirmed with its publish.
"""

from __future__ import annotations

import datetime
import secrets
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pamqp import commands, header

from halfmoon.amqp.message import (
    decode_envelope,
    encode_envelope,
    expires_at,
    outgoing,
    priority_in,
)
from halfmoon.amqp.queues import Queues, TxSettle
from halfmoon.amqp.reply_codes import AmqpChannelError
from halfmoon.amqp.topology import Queue, VHost
from halfmoon.broker.message import MessageView, OutgoingMessage
from halfmoon.errors import HalfmoonError

REJECTED = "rejected"
EXPIRED = "expired"
MAXLEN = "maxlen"
# Reasons a broker gives by itself: only these can make a cycle.
_AUTOMATIC = (EXPIRED, MAXLEN)

_CONTENT_HEAD = struct.Struct(">HHQ")


def has_dead_letter_exchange(queue: Queue) -> bool:
    return "x-dead-letter-exchange" in queue.arguments


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


@dataclass(frozen=True, slots=True)
class Original:
    """A message as it left its queue: where it was published, its property bytes, its body."""

    exchange: str
    routing_key: str
    raw_properties: bytes
    body: bytes

    @classmethod
    def of(cls, view: MessageView) -> Original:
        envelope = decode_envelope(view)
        return cls(envelope.exchange, envelope.routing_key, envelope.raw_properties, view.body)


def properties_of(raw_properties: bytes) -> commands.Basic.Properties:
    decoded = header.ContentHeader()
    decoded.unmarshal(_CONTENT_HEAD.pack(60, 0, 0) + raw_properties)
    return decoded.properties


def with_death(
    properties: commands.Basic.Properties,
    queue: str,
    reason: str,
    original: Original,
    now: datetime.datetime,
) -> list[Mapping[str, Any]]:
    """Record the death in ``properties`` (headers, expiration); the new ``x-death``."""
    headers: dict[str, Any] = dict(properties.headers or {})
    before = headers.get("x-death")
    deaths: list[Mapping[str, Any]] = [
        d for d in (before if isinstance(before, list) else []) if isinstance(d, Mapping)
    ]
    count = 0
    kept = []
    for death in deaths:
        if _text(death.get("queue", "")) == queue and _text(death.get("reason", "")) == reason:
            previous = death.get("count", 1)
            count = previous if isinstance(previous, int) and previous > 0 else 1
        else:
            kept.append(death)
    entry: dict[str, Any] = {
        "count": count + 1,
        "reason": reason,
        "queue": queue,
        "time": now,
        "exchange": original.exchange,
        "routing-keys": [original.routing_key],
    }
    if reason == EXPIRED and properties.expiration is not None:
        entry["original-expiration"] = properties.expiration
    deaths = [entry, *kept]
    headers["x-death"] = deaths
    if "x-first-death-queue" not in headers:
        headers["x-first-death-queue"] = queue
        headers["x-first-death-reason"] = reason
        headers["x-first-death-exchange"] = original.exchange
    headers["x-last-death-queue"] = queue
    headers["x-last-death-reason"] = reason
    headers["x-last-death-exchange"] = original.exchange
    properties.headers = headers
    properties.expiration = None
    return deaths


def _cycles_into(target: Queue, deaths: Sequence[Mapping[str, Any]]) -> bool:
    """The copy already died in ``target`` and only the broker moved it since."""
    if any(_text(d.get("reason", "")) not in _AUTOMATIC for d in deaths):
        return False
    return any(_text(d.get("queue", "")) == target.name for d in deaths)


def copies(
    vhost: VHost,
    queue: Queue,
    original: Original,
    reason: str,
    now_ms: int,
    transaction_group: str | None = None,
) -> list[OutgoingMessage]:
    """The dead-lettered copies of ``original`` leaving ``queue`` for ``reason``, one per queue
    its dead-letter exchange routes them to ([] when it has none or they reach nowhere)."""
    if not has_dead_letter_exchange(queue):
        return []
    exchange = _text(queue.arguments["x-dead-letter-exchange"])
    routing_key = _text(queue.arguments.get("x-dead-letter-routing-key", original.routing_key))
    properties = properties_of(original.raw_properties)
    now = datetime.datetime.fromtimestamp(now_ms // 1000, tz=datetime.UTC)
    deaths = with_death(properties, queue.name, reason, original, now)
    try:
        targets = vhost.route(exchange, routing_key, properties.headers or {}, dead_letter=True)
    except AmqpChannelError:  # the exchange is gone: RabbitMQ drops the message
        return []
    targets = [t for t in targets if not _cycles_into(t, deaths)]
    if not targets:
        return []
    envelope = encode_envelope(exchange, routing_key, bytes(properties.marshal()))
    return [
        outgoing(
            t.stored,
            original.body,
            envelope,
            expires=expires_at(None, t.arguments.get("x-message-ttl"), now_ms),
            transaction_group=transaction_group,
            priority=priority_in(t, properties.priority),
        )
        for t in targets
    ]


class DeadLetters:
    """Moves messages out of their queues, dead-lettered or dropped, atomically."""

    def __init__(self, queues: Queues) -> None:
        self._queues = queues
        self._prefix = f"amqp-dlx-{secrets.token_hex(4)}"
        self._count = 0

    def group_id(self) -> str:
        self._count += 1
        return f"{self._prefix}-{self._count}"

    async def move(
        self,
        vhost: VHost,
        leaving: Sequence[tuple[Queue, MessageView]],
        reason: str,
        now_ms: int,
    ) -> None:
        """Remove each delivered message from its queue, its dead-lettered copies stored in the
        same transaction group (a plain ack when none has a copy)."""
        if not leaving:
            return
        group_id = self.group_id()
        planned = [
            (queue, view, copies(vhost, queue, Original.of(view), reason, now_ms, group_id))
            for queue, view in leaving
        ]
        queues = self._queues
        if not any(c for _, _, c in planned):
            by_queue: dict[str, list[str]] = {}
            for queue, view, _ in planned:
                by_queue.setdefault(queue.stored, []).append(view.receipt_handle or "")
            for stored, handles in by_queue.items():
                await queues.ack(stored, handles)
            return
        members = [message for _, _, messages in planned for message in messages]
        settles = [
            TxSettle(queue.stored, view.receipt_handle or "", False) for queue, view, _ in planned
        ]
        try:
            await queues.tx_commit(group_id, members, settles)
        except HalfmoonError:
            # Nothing of the group applied (a copy refused, the broker going): return the
            # originals to their queues rather than lose them.
            for queue, view, _ in planned:
                await queues.requeue(queue.stored, [view.receipt_handle or ""])
            raise
