"""An AMQP message as a halfmoon message and back.

The body is the message's body. Where it was published (exchange, routing
key) and its properties and headers exactly as the publisher encoded them
travel in one user property, ``amqp``: base64 of ``shortstr exchange,
shortstr routing key, property bytes``. So a consumer gets the property bytes
back unchanged (no decode and re-encode of header tables on delivery), and a
gRPC consumer of the same queue still sees an ordinary message.

Time to live: a message's ``expiration`` property and its queue's
``x-message-ttl`` (the smaller wins) become an absolute deadline in the
``amqp-expires`` property, per queue, at publish; a delivery or Basic.Get
that finds the deadline passed dead-letters the message, or drops it without
a dead-letter exchange, unseen (:mod:`halfmoon.amqp.dead_letter`; the
server also expires queue heads by itself, :mod:`halfmoon.amqp.housekeeping`).
With ``x-max-priority`` the message's ``priority`` property picks its queue
of the priority topic (:func:`priority_in`). ``x-delay`` (a header,
in ms, as RabbitMQ's delayed-message exchange reads it) makes the message a
halfmoon delay message, delivered from then on.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from halfmoon.broker.message import MessageType, MessageView, OutgoingMessage

if TYPE_CHECKING:
    from halfmoon.amqp.topology import Queue

PROPERTY = "amqp"
EXPIRES = "amqp-expires"
# Property bytes of a message with no properties (flags 0): messages sent over gRPC.
NO_PROPERTIES = b"\x00\x00"


def _shortstr(text: str) -> bytes:
    raw = text.encode()
    return bytes((len(raw),)) + raw


def encode_envelope(exchange: str, routing_key: str, raw_properties: bytes) -> str:
    return base64.b64encode(_shortstr(exchange) + _shortstr(routing_key) + raw_properties).decode(
        "ascii"
    )


@dataclass(frozen=True, slots=True)
class Envelope:
    exchange: str
    routing_key: str
    raw_properties: bytes


def decode_envelope(view: MessageView) -> Envelope:
    """Where ``view`` was published and its property bytes (a gRPC message: the queue's
    default exchange, its tag as routing key, no properties)."""
    text = view.properties.get(PROPERTY)
    if text is None:
        return Envelope("", view.tag or "", NO_PROPERTIES)
    raw = base64.b64decode(text)
    n = raw[0]
    exchange = raw[1 : 1 + n].decode()
    m = raw[1 + n]
    routing_key = raw[2 + n : 2 + n + m].decode()
    return Envelope(exchange, routing_key, raw[2 + n + m :])


def _milliseconds(value: object) -> int | None:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, bool):
        return None
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def expires_at(expiration: object, queue_ttl: object, now_ms: int) -> int | None:
    """The deadline (epoch ms) of a message with ``expiration`` in a queue with ``x-message-ttl``
    ``queue_ttl`` (either may be None), or None when it lives until consumed."""
    ttls = [t for t in (_milliseconds(expiration), _milliseconds(queue_ttl)) if t is not None]
    return now_ms + min(ttls) if ttls else None


def delay_ms(headers: Mapping[str, object] | None) -> int | None:
    """The ``x-delay`` header in ms, when positive."""
    if not headers or "x-delay" not in headers:
        return None
    delay = _milliseconds(headers["x-delay"])
    return delay if delay else None


def expired(view: MessageView, now_ms: int) -> bool:
    deadline = view.properties.get(EXPIRES)
    return deadline is not None and deadline.isdigit() and int(deadline) <= now_ms


def max_priority(queue: Queue) -> int | None:
    """A priority queue's ``x-max-priority`` (checked at declare), else None."""
    value = queue.arguments.get("x-max-priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def priority_in(queue: Queue, priority: object) -> int | None:
    """The broker priority of a message with the ``priority`` property in ``queue``: None for
    a queue without ``x-max-priority``, else the property (0 when absent); the broker
    clamps it to the queue's highest, as RabbitMQ treats a priority above the maximum."""
    if max_priority(queue) is None:
        return None
    return priority if isinstance(priority, int) and priority >= 0 else 0


def outgoing(
    topic: str,
    body: bytes,
    envelope: str,
    *,
    transaction_group: str | None = None,
    delivery_timestamp: int | None = None,
    expires: int | None = None,
    priority: int | None = None,
) -> OutgoingMessage:
    properties = {PROPERTY: envelope}
    if expires is not None:
        properties[EXPIRES] = str(expires)
    if transaction_group is not None:
        kind = MessageType.TRANSACTION
    elif delivery_timestamp is not None:
        kind = MessageType.DELAY
    elif priority is not None:
        kind = MessageType.PRIORITY
    else:
        kind = MessageType.NORMAL
    return OutgoingMessage(
        topic=topic,
        body=body,
        properties=properties,
        message_type=kind,
        queue_id=0,
        transaction_group=transaction_group,
        delivery_timestamp=delivery_timestamp,
        producer_group="amqp" if transaction_group is not None else None,
        priority=priority,
    )
