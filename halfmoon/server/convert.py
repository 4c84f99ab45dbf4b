"""Protobuf ⇄ broker objects. Pure functions; no broker calls, no I/O.

Inbound checks here are about the *protocol* (a digest that does not match
the body, an unknown encoding, a message type the wire enum has but halfmoon
does not support); everything about topics, groups and limits is the
broker's business.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable

from google.protobuf import duration_pb2, timestamp_pb2
from rocketmq.grpc_protocol import definition_pb2
from rocketmq.grpc_protocol import definition_pb2 as pb

from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import (
    PROPERTY_MESSAGE_GROUP,
    PROPERTY_TRANSACTION_GROUP,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_TIMEOUT,
    MessageType,
    MessageView,
    OutgoingMessage,
)
from halfmoon.broker.produce import verify_body_digest
from halfmoon.server import namespace as ns
from halfmoon.server.errors import RequestError, Unsupported

WireType = definition_pb2.MessageType

_TYPE_FROM_WIRE = {
    WireType.NORMAL: MessageType.NORMAL,
    WireType.FIFO: MessageType.FIFO,
    WireType.DELAY: MessageType.DELAY,
    WireType.TRANSACTION: MessageType.TRANSACTION,
    WireType.PRIORITY: MessageType.PRIORITY,
    WireType.LITE: MessageType.LITE,
}
_TYPE_TO_WIRE = {v: k for k, v in _TYPE_FROM_WIRE.items()}

# Enum numbers as plain ints: ``pb.Encoding.GZIP`` & co. go through a Python-level
# ``__getattr__`` on every access, which shows in the per-message cost of a send.
_DIGEST_NONE = pb.DigestType.DIGEST_TYPE_UNSPECIFIED
_DIGEST_CRC32 = pb.DigestType.CRC32
_DIGESTS = frozenset((pb.DigestType.CRC32, pb.DigestType.MD5, pb.DigestType.SHA1))
_ENCODING_IDENTITY = frozenset((pb.Encoding.IDENTITY, pb.Encoding.ENCODING_UNSPECIFIED))
_ENCODING_GZIP = pb.Encoding.GZIP
_WIRE_UNSPECIFIED = WireType.MESSAGE_TYPE_UNSPECIFIED
_WIRE_NORMAL = WireType.NORMAL

# A gzip body may not inflate beyond this (a "zip bomb" is a request error, not an OOM).
MAX_INFLATED_BODY = 64 * 1024 * 1024


# -- time ---------------------------------------------------------------------


def timestamp_ms(ts: timestamp_pb2.Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def to_timestamp(ms: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def duration_ms(d: duration_pb2.Duration) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


def to_duration(ms: int | float) -> duration_pb2.Duration:
    ms = int(ms)
    return duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


# -- message types --------------------------------------------------------------


def wire_type(message_type: MessageType) -> int:
    return _TYPE_TO_WIRE.get(message_type, WireType.NORMAL)


def _message_type(msg: pb.Message) -> MessageType:
    sp = msg.system_properties
    wire = sp.message_type
    if wire == _WIRE_UNSPECIFIED:
        # Older clients leave it unset: infer it as RocketMQ's proxy does.
        if sp.HasField("message_group"):
            return MessageType.FIFO
        if sp.HasField("delivery_timestamp"):
            return MessageType.DELAY
        if sp.HasField("priority"):
            return MessageType.PRIORITY
        if sp.HasField("lite_topic"):
            return MessageType.LITE
        return MessageType.NORMAL
    if wire in _TYPE_FROM_WIRE:
        return _TYPE_FROM_WIRE[wire]
    name = WireType.Name(wire) if wire in WireType.values() else str(wire)
    raise Unsupported(
        f"message type {name} is not supported by halfmoon; send NORMAL, FIFO, DELAY, "
        "TRANSACTION, PRIORITY or LITE messages"
    )


# -- inbound messages -------------------------------------------------------------


def verify_digest(body: bytes, digest: pb.Digest) -> None:
    """Raise BodyDigestMismatch when the client sent a digest that the body does not match."""
    kind = digest.type
    if kind == _DIGEST_NONE:
        return
    if kind not in _DIGESTS:
        raise RequestError(f"unknown body digest type {kind}; use CRC32, MD5 or SHA1")
    if kind == _DIGEST_CRC32 and digest.checksum.strip() == str(zlib.crc32(body) & 0xFFFFFFFF):
        return  # the decimal rendering (the Node.js client's), besides the usual hex
    verify_body_digest(body, pb.DigestType.Name(kind), digest.checksum)


def _decoded(raw: bytes, encoding: int) -> bytes:
    if encoding in _ENCODING_IDENTITY:
        return raw
    if encoding == _ENCODING_GZIP:
        try:
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            body = inflater.decompress(raw, MAX_INFLATED_BODY + 1)
        except (zlib.error, OSError, EOFError) as exc:
            raise RequestError(f"message body is marked GZIP but does not inflate: {exc}") from None
        if len(body) > MAX_INFLATED_BODY:
            raise RequestError(f"GZIP message body inflates beyond {MAX_INFLATED_BODY} bytes")
        return body
    raise RequestError(f"unknown body encoding {encoding}; use IDENTITY or GZIP")


# Timestamp seconds beyond this (the year 5138) can only be milliseconds put in the
# seconds field, which the official Python client does when its docs are followed.
_SECONDS_THAT_ARE_MILLIS = 10**11


def _delivery_ms(ts: timestamp_pb2.Timestamp) -> int:
    if ts.seconds > _SECONDS_THAT_ARE_MILLIS and ts.nanos == 0:
        return ts.seconds
    return timestamp_ms(ts)


def outgoing_message(
    msg: pb.Message,
    peer_host: str = "",
    producer_group: str | None = None,
    *,
    namespace: str = "",
) -> OutgoingMessage:
    """The broker's OutgoingMessage for one wire message (digest checked, body decoded).

    ``producer_group`` is the sending client's, when it told us one (the
    official clients do not): it is recorded on half messages so checks go to
    that group first. ``namespace`` is the request's ``x-mq-namespace``
    header: the topic is stored in the message's own namespace, else that one.
    """
    resource = msg.topic
    topic = resource.name
    if not topic:
        raise RequestError("message has no topic; set message.topic.name")
    if namespace or resource.resource_namespace:
        topic = ns.resolve(resource, namespace)
    sp = msg.system_properties
    raw = msg.body  # each read of a bytes field copies it: read it once
    if sp.HasField("body_digest"):
        verify_digest(raw, sp.body_digest)
    body = _decoded(raw, sp.body_encoding)
    if not body:
        # RocketMQ 5 refuses empty bodies at the protocol edge; so does halfmoon.
        raise RequestError(
            "message body is empty; send at least one byte", code="MESSAGE_BODY_EMPTY"
        )
    message_type = _message_type(msg)
    wire_properties = msg.user_properties
    # A comprehension over the protobuf map: dict(map) goes through the Mapping mixins, over
    # twice as slow, and this runs once per message of every send.
    properties = {k: wire_properties[k] for k in wire_properties} if wire_properties else {}
    transaction_group = None
    transaction_timeout_ms = None
    if message_type is MessageType.TRANSACTION and PROPERTY_TRANSACTION_GROUP in properties:
        # The transaction-group convention (docs/transactions.md): a reserved user
        # property on half messages, which the official clients never set. On any
        # other message it stays reserved and the broker refuses it.
        transaction_group = properties.pop(PROPERTY_TRANSACTION_GROUP)
        if PROPERTY_TRANSACTION_TIMEOUT in properties:
            transaction_timeout_ms = _timeout_ms(properties.pop(PROPERTY_TRANSACTION_TIMEOUT))
    return OutgoingMessage(
        topic=topic,
        body=body,
        message_id=sp.message_id,
        tag=sp.tag if sp.HasField("tag") and sp.tag else None,
        keys=list(sp.keys) if sp.keys else [],
        properties=properties,
        message_type=message_type,
        producer_group=producer_group
        if message_type is MessageType.TRANSACTION and producer_group
        else None,
        transaction_group=transaction_group,
        transaction_timeout_ms=transaction_timeout_ms,
        message_group=sp.message_group
        if sp.HasField("message_group") and sp.message_group
        else None,
        delivery_timestamp=_delivery_ms(sp.delivery_timestamp)
        if sp.HasField("delivery_timestamp")
        else None,
        born_timestamp=timestamp_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else 0,
        born_host=sp.born_host or peer_host,
        queue_id=None,
        check_immunity_seconds=(
            max(duration_ms(sp.orphaned_transaction_recovery_duration) // 1000, 0)
            if sp.HasField("orphaned_transaction_recovery_duration")
            else None
        ),
        # RocketMQ's broker drops a priority on any message that is not a PRIORITY one;
        # a lite topic counts only on a LITE message (and an empty one is refused there).
        priority=sp.priority
        if message_type is MessageType.PRIORITY and sp.HasField("priority")
        else None,
        lite_topic=sp.lite_topic
        if message_type is MessageType.LITE and sp.HasField("lite_topic")
        else None,
    )


def _timeout_ms(value: str) -> int:
    """A transaction group member's ``__HM_TXN_TIMEOUT_MS``: a whole number of ms."""
    try:
        return int(value)
    except ValueError:
        raise RequestError(
            f"{PROPERTY_TRANSACTION_TIMEOUT} must be a whole number of milliseconds, got {value!r}",
            code="ILLEGAL_TRANSACTION_TIMEOUT",
        ) from None


def filter_spec(expression: pb.FilterExpression | None) -> FilterSpec:
    """The broker FilterSpec for a wire FilterExpression (missing → TAG ``*``)."""
    if expression is None:
        return FilterSpec()
    text = expression.expression.strip()
    if expression.type == pb.FilterType.SQL:
        return FilterSpec(kind="SQL92", expression=text)
    return FilterSpec(kind="TAG", expression=text or "*")


# -- outbound messages ------------------------------------------------------------


_DIGEST_MD5 = pb.DigestType.MD5
_ENCODING_IDENTITY_NUMBER = pb.Encoding.IDENTITY


def wire_message(view: MessageView, store_host: str = "") -> pb.Message:
    """The wire Message for a delivered MessageView (receipt handle and attempt included).

    The topic is named as its client knows it: the bare name plus the
    namespace the stored name carries (RocketMQ's ``GrpcConverter.buildResource``).
    The message group and a transaction id also go into the user properties
    (``__SHARDINGKEY``, ``__transactionId__``): RocketMQ's proxy hands every
    stored property outside its system set to the client, and these two are
    outside it, so the official clients show them.
    """
    message = pb.Message()
    fill_wire_message(message, view, store_host)
    return message


def fill_wire_message(message: pb.Message, view: MessageView, store_host: str = "") -> None:
    """:func:`wire_message` written into ``message`` (a fresh one, or a field of a larger
    message: a check command holds its message in place of a copy)."""
    body = view.body
    namespace, name = ns.split(view.topic)
    topic = message.topic
    topic.name = name
    if namespace:
        topic.resource_namespace = namespace
    if view.properties:
        message.user_properties.update(view.properties)
    message.body = body
    if view.message_group:
        message.user_properties[PROPERTY_MESSAGE_GROUP] = view.message_group
    if view.transaction_id:
        message.user_properties[PROPERTY_TRANSACTION_ID] = view.transaction_id
    # Filled in place: building a SystemProperties and passing it in would copy it.
    sp = message.system_properties
    if view.keys:
        sp.keys.extend(view.keys)
    sp.message_id = view.message_id
    # MD5 in upper-case hex, as RocketMQ's proxy sends: the one digest every official
    # client checks the same way (their CRC32 renderings disagree: hex vs decimal).
    digest = sp.body_digest
    digest.type = _DIGEST_MD5
    digest.checksum = hashlib.md5(body).hexdigest().upper()
    sp.body_encoding = _ENCODING_IDENTITY_NUMBER
    sp.message_type = _TYPE_TO_WIRE.get(view.message_type, _WIRE_NORMAL)
    sp.born_host = view.born_host
    sp.store_host = view.store_host or store_host
    sp.queue_id = max(view.queue_id, 0)
    sp.queue_offset = view.queue_offset
    if view.tag:
        sp.tag = view.tag
    _set_timestamp(sp.born_timestamp, view.born_timestamp)
    _set_timestamp(sp.store_timestamp, view.store_timestamp)
    if view.delivery_timestamp is not None:
        _set_timestamp(sp.delivery_timestamp, view.delivery_timestamp)
    if view.receipt_handle is not None:
        sp.receipt_handle = view.receipt_handle
    if view.invisible_duration_ms is not None:
        ms = int(view.invisible_duration_ms)
        sp.invisible_duration.seconds = ms // 1000
        sp.invisible_duration.nanos = (ms % 1000) * 1_000_000
    sp.delivery_attempt = view.delivery_attempt
    if view.message_group:
        sp.message_group = view.message_group
    if view.priority is not None:
        sp.priority = view.priority
    if view.lite_topic is not None:
        sp.lite_topic = view.lite_topic


def _set_timestamp(ts: timestamp_pb2.Timestamp, ms: int) -> None:
    # Setting both fields marks the field present even when both are zero (the epoch).
    ts.seconds = ms // 1000
    ts.nanos = (ms % 1000) * 1_000_000
    if not ms:
        ts.SetInParent()


def wire_messages(views: Iterable[MessageView], store_host: str = "") -> list[pb.Message]:
    return [wire_message(v, store_host) for v in views]
