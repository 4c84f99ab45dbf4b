"""Messages as the client's users see them, and their wire form.

:class:`Message` is what a producer sends (topic, body, tag, keys,
properties, FIFO message group, delivery time). :class:`MessageView` is what
a consumer receives: the same fields plus where it was stored and, for
consumers that acknowledge, its receipt handle and delivery attempt.
:class:`SendReceipt` is the server's answer to one sent message.

Message ids are generated here, RocketMQ 5 style (``01`` + host/pid prefix +
seconds + sequence, 34 hex characters), so that a retried send keeps its id.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
import uuid
from dataclasses import dataclass, field

from google.protobuf import timestamp_pb2
from rocketmq.grpc_protocol import definition_pb2 as pb

WireType = pb.MessageType

# Stored properties the server hands over among the user properties, as RocketMQ's
# proxy does; this client shows them as ``message_group`` and ``transaction_id``.
_SHARDING_KEY = "__SHARDINGKEY"
_TRANSACTION_ID = "__transactionId__"


@dataclass
class Message:
    """One message to send.

    ``delivery_timestamp`` (epoch milliseconds) makes it a delay message;
    ``message_group`` a FIFO message (the topic must accept that type).
    ``keys`` are indexed for queries by key. ``properties`` are user
    properties (strings), visible to SQL92 selectors.
    """

    topic: str
    body: bytes
    tag: str | None = None
    keys: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    message_group: str | None = None
    delivery_timestamp: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.body, str):
            self.body = self.body.encode()
        if isinstance(self.keys, str):
            self.keys = [self.keys]
        if not self.topic:
            raise ValueError("message topic is empty")
        if not self.body:
            raise ValueError("message body is empty; send at least one byte")
        if self.message_group is not None and self.delivery_timestamp is not None:
            raise ValueError(
                "a message is either FIFO (message_group) or delayed (delivery_timestamp), not both"
            )

    def with_delay(self, seconds: float) -> Message:
        """Set the delivery time ``seconds`` from now (a delay message); returns self."""
        self.delivery_timestamp = int(time.time() * 1000 + seconds * 1000)
        return self


@dataclass(frozen=True)
class SendReceipt:
    """The server's answer to one sent message."""

    message_id: str
    offset: int
    transaction_id: str = ""
    recall_handle: str = ""
    endpoint: str = ""


@dataclass
class MessageView:
    """A received message (read-only by convention)."""

    topic: str
    body: bytes
    message_id: str
    tag: str | None
    keys: list[str]
    properties: dict[str, str]
    message_group: str | None
    delivery_timestamp: int | None
    born_timestamp: int
    store_timestamp: int
    born_host: str
    queue_id: int
    queue_offset: int
    delivery_attempt: int
    message_type: str
    receipt_handle: str | None = None
    endpoint: str = ""
    transaction_id: str = ""

    @property
    def reconsume_times(self) -> int:
        """How often this message was delivered before (RocketMQ's reconsumeTimes)."""
        return max(self.delivery_attempt - 1, 0)


def timestamp_ms(ts: timestamp_pb2.Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def to_timestamp(ms: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


# Built once: ``WireType.values()`` builds a list and ``WireType.Name`` looks the name up, per call.
_WIRE_TYPE_NAMES = {value.number: value.name for value in WireType.DESCRIPTOR.values}


def view_of(message: pb.Message, endpoint: str = "") -> MessageView:
    """The :class:`MessageView` of a wire message."""
    sp = message.system_properties
    properties = dict(message.user_properties)
    if _SHARDING_KEY in properties:
        del properties[_SHARDING_KEY]
    transaction_id = properties.pop(_TRANSACTION_ID, "")
    born, stored = sp.born_timestamp, sp.store_timestamp
    # Positional, in field order: a view per received message (a producer gets one per check).
    return MessageView(
        message.topic.name,
        message.body,
        sp.message_id,
        sp.tag or None,  # unset and empty alike
        list(sp.keys),
        properties,
        sp.message_group or None,
        timestamp_ms(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else None,
        born.seconds * 1000 + born.nanos // 1_000_000,
        stored.seconds * 1000 + stored.nanos // 1_000_000,
        sp.born_host,
        sp.queue_id,
        sp.queue_offset,
        sp.delivery_attempt,
        _WIRE_TYPE_NAMES.get(sp.message_type, "NORMAL"),
        sp.receipt_handle if sp.HasField("receipt_handle") else None,
        endpoint,
        transaction_id,
    )


def wire_type(message: Message, transactional: bool = False) -> int:
    if transactional:
        return WireType.TRANSACTION
    if message.message_group is not None:
        return WireType.FIFO
    if message.delivery_timestamp is not None:
        return WireType.DELAY
    return WireType.NORMAL


_BORN_HOST = ""


def born_host() -> str:
    global _BORN_HOST
    if not _BORN_HOST:
        try:
            _BORN_HOST = socket.gethostbyname(socket.gethostname())
        except OSError:
            _BORN_HOST = "127.0.0.1"
    return _BORN_HOST


def to_wire(
    message: Message, message_id: str, namespace: str = "", *, transactional: bool = False
) -> pb.Message:
    """The protocol Message for ``message`` with id ``message_id``."""
    sp = pb.SystemProperties(
        message_id=message_id,
        message_type=wire_type(message, transactional),
        body_encoding=pb.Encoding.IDENTITY,
        born_host=born_host(),
        keys=message.keys,
    )
    sp.born_timestamp.CopyFrom(to_timestamp(int(time.time() * 1000)))
    if message.tag:
        sp.tag = message.tag
    if message.message_group is not None:
        sp.message_group = message.message_group
    if message.delivery_timestamp is not None:
        sp.delivery_timestamp.CopyFrom(to_timestamp(message.delivery_timestamp))
    return pb.Message(
        topic=pb.Resource(name=message.topic, resource_namespace=namespace),
        user_properties=message.properties,
        system_properties=sp,
        body=message.body,
    )


class MessageIdGenerator:
    """RocketMQ 5 style ids: version ``01``, 12 hex of host + 4 of pid, 8 of seconds, 8 of
    sequence."""

    _EPOCH = 1609459200  # 2021-01-01T00:00:00Z, RocketMQ's custom epoch

    def __init__(self) -> None:
        node = uuid.getnode().to_bytes(6, "big").hex().upper()
        pid = (os.getpid() & 0xFFFF).to_bytes(2, "big").hex().upper()
        self._prefix = "01" + node + pid
        self._seq = itertools.count()

    def next(self) -> str:
        seconds = (int(time.time()) - self._EPOCH) & 0xFFFFFFFF
        return f"{self._prefix}{seconds:08X}{next(self._seq) & 0xFFFFFFFF:08X}"


message_ids = MessageIdGenerator()
