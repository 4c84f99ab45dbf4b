"""AMQP 0-9-1 framing: the protocol header, frames out of a byte stream, frames into bytes.

A frame is ``type:1 channel:2 size:4 payload:size 0xCE``. :class:`FrameReader`
cuts complete frames out of what the socket delivered and checks the size
against the negotiated ``frame_max`` and the end octet before anything decodes
the payload, so pamqp only ever sees a complete method frame. Content
headers are split here too: the fixed part (class, weight, body size) is read
by hand and the property bytes are kept raw, so a message's properties and
headers are stored and delivered byte for byte as the publisher sent them.

Server frames are encoded with :func:`encode_method`, which marshals pamqp's
method classes without their name validation (RabbitMQ accepts any UTF-8 name
up to 255 bytes; pamqp's regex refuses some of them). The hot frames (Deliver,
Ack, the content header, body) have hand-written encoders.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from pamqp import base, commands, encode, header
from pamqp import exceptions as pamqp_exceptions

from halfmoon.amqp.reply_codes import FRAME_ERROR, SYNTAX_ERROR, AmqpConnectionError, AmqpError

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
FRAME_OVERHEAD = 8  # 7-byte header and the end octet
MIN_FRAME_MAX = 4096  # the spec's smallest frame_max a peer must accept

_HEAD = struct.Struct(">BHI")
_CONTENT_HEAD = struct.Struct(">HHQ")
_METHOD_INDEX = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class Frame:
    kind: int  # FRAME_METHOD, FRAME_HEADER, FRAME_BODY or FRAME_HEARTBEAT
    channel: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class ContentHeader:
    """A content header frame: body size, the raw property bytes and their decoded form."""

    class_id: int
    body_size: int
    raw_properties: bytes  # property flags and list, as sent
    properties: commands.Basic.Properties


class FrameReader:
    """Complete frames out of a byte stream; a malformed frame is a connection error."""

    def __init__(self, frame_max: int) -> None:
        self._buffer = bytearray()
        self.frame_max = frame_max

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames: list[Frame] = []
        buffer = self._buffer
        start = 0
        end = len(buffer)
        while end - start >= 7:
            kind, channel, size = _HEAD.unpack_from(buffer, start)
            if size + FRAME_OVERHEAD > self.frame_max:
                raise AmqpConnectionError(
                    FRAME_ERROR,
                    f"frame of {size + FRAME_OVERHEAD} bytes is larger than the negotiated "
                    f"frame_max {self.frame_max}",
                )
            if kind not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT):
                raise AmqpConnectionError(FRAME_ERROR, f"unknown frame type {kind}")
            stop = start + 7 + size
            if stop >= end:
                break
            if buffer[stop] != FRAME_END:
                raise AmqpConnectionError(
                    FRAME_ERROR,
                    f"frame end octet is 0x{buffer[stop]:02x}, expected 0xce: the stream is "
                    "out of step",
                )
            frames.append(Frame(kind, channel, bytes(buffer[start + 7 : stop])))
            start = stop + 1
        if start:
            del buffer[:start]
        return frames

    def take_protocol_header(self, data: bytes) -> bytes | None:
        """Buffer ``data`` until 8 bytes arrived; those 8 bytes (the rest stays buffered)."""
        self._buffer += data
        if len(self._buffer) < 8:
            return None
        header = bytes(self._buffer[:8])
        del self._buffer[:8]
        return header

    def pending(self) -> bytes:
        """What is buffered and not yet a frame (after the protocol header, say)."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest


def decode_method(payload: bytes) -> base.Frame:
    """The method in a complete method frame's payload (a syntax error names what was wrong)."""
    if len(payload) < 4:
        raise AmqpConnectionError(FRAME_ERROR, "method frame shorter than its method index")
    (index,) = _METHOD_INDEX.unpack_from(payload)
    cls: Any = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise AmqpConnectionError(
            SYNTAX_ERROR, f"unknown method (class {index >> 16}, method {index & 0xFFFF})"
        )
    method: base.Frame = cls.__new__(cls)
    try:
        method.unmarshal(payload[4:])
    except (struct.error, ValueError, TypeError, IndexError, UnicodeDecodeError) as exc:
        raise AmqpConnectionError(
            SYNTAX_ERROR, f"malformed {cls.name} frame: {exc}", cls.index >> 16, cls.index & 0xFFFF
        ) from None
    except pamqp_exceptions.PAMQPException as exc:
        raise AmqpConnectionError(SYNTAX_ERROR, f"malformed {cls.name} frame: {exc}") from None
    return method


def decode_content_header(payload: bytes) -> ContentHeader:
    if len(payload) < 14:
        raise AmqpConnectionError(FRAME_ERROR, "content header frame too short")
    class_id, _weight, body_size = _CONTENT_HEAD.unpack_from(payload)
    decoded = header.ContentHeader()
    try:
        decoded.unmarshal(payload)
    except (struct.error, ValueError, TypeError, IndexError, UnicodeDecodeError) as exc:
        raise AmqpConnectionError(FRAME_ERROR, f"malformed content header: {exc}") from None
    except pamqp_exceptions.PAMQPException as exc:
        raise AmqpConnectionError(FRAME_ERROR, f"malformed content header: {exc}") from None
    return ContentHeader(class_id, body_size, payload[12:], decoded.properties)


def encode_method(method: base.Frame, channel: int) -> bytes:
    """A method frame for ``method``, marshalled without pamqp's validation of names."""
    parts: list[bytes] = [_METHOD_INDEX.pack(method.index)]
    bits = 0
    bit_count = 0
    in_bits = False
    for name in method.__slots__:
        kind = method.amqp_type(name)
        value: Any = getattr(method, name, None)
        if kind == "bit":
            if not in_bits:
                bits, bit_count, in_bits = 0, 0, True
            if value:
                bits |= 1 << bit_count
            bit_count += 1
            if bit_count == 8:
                parts.append(bytes((bits,)))
                in_bits = False
            continue
        if in_bits:
            parts.append(bytes((bits,)))
            in_bits = False
        if value is None:
            value = {} if kind == "table" else ("" if kind in ("shortstr", "longstr") else 0)
        parts.append(encode.by_type(value, kind))
    if in_bits:
        parts.append(bytes((bits,)))
    payload = b"".join(parts)
    return _HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE


def method(cls: type[base.Frame], **fields: Any) -> base.Frame:
    """An instance of ``cls`` with ``fields`` set (the others empty), built without the
    constructor's validation; for :func:`encode_method`."""
    instance = cls.__new__(cls)
    for name in cls.__slots__:
        setattr(instance, name, fields.get(name))
    return instance


def close_for(
    cls: type[commands.Channel.Close | commands.Connection.Close], error: AmqpError
) -> base.Frame:
    """The Channel.Close or Connection.Close that tells a client of ``error``."""
    return method(
        cls,
        reply_code=error.code,
        reply_text=error.reply_text,
        class_id=error.class_id,
        method_id=error.method_id,
    )


def encode_content(channel: int, raw_properties: bytes, body: bytes, frame_max: int) -> bytes:
    """The content header and body frames of a message (class basic)."""
    header = _CONTENT_HEAD.pack(60, 0, len(body)) + raw_properties
    parts = [_HEAD.pack(FRAME_HEADER, channel, len(header)), header, FRAME_END_BYTE]
    chunk = frame_max - FRAME_OVERHEAD
    for start in range(0, len(body), chunk):
        piece = body[start : start + chunk]
        parts += (_HEAD.pack(FRAME_BODY, channel, len(piece)), piece, FRAME_END_BYTE)
    return b"".join(parts)


def encode_properties(properties: commands.Basic.Properties) -> bytes:
    """The raw property bytes (flags and list) of ``properties``."""
    return bytes(properties.marshal())


HEARTBEAT_FRAME = _HEAD.pack(FRAME_HEARTBEAT, 0, 0) + FRAME_END_BYTE

_DELIVER_INDEX = _METHOD_INDEX.pack(commands.Basic.Deliver.index)
_ACK_INDEX = _METHOD_INDEX.pack(commands.Basic.Ack.index)
_NACK_INDEX = _METHOD_INDEX.pack(commands.Basic.Nack.index)


def _shortstr(text: str) -> bytes:
    raw = text.encode()
    return bytes((len(raw),)) + raw


def encode_deliver(
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
) -> bytes:
    payload = b"".join(
        (
            _DELIVER_INDEX,
            _shortstr(consumer_tag),
            struct.pack(">QB", delivery_tag, 1 if redelivered else 0),
            _shortstr(exchange),
            _shortstr(routing_key),
        )
    )
    return _HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE


def encode_confirm(channel: int, delivery_tag: int, multiple: bool, ack: bool = True) -> bytes:
    """Basic.Ack (or, ``ack`` False, Basic.Nack without requeue) from the server."""
    payload = (_ACK_INDEX if ack else _NACK_INDEX) + struct.pack(
        ">QB", delivery_tag, 1 if multiple else 0
    )
    return _HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE
