"""The commit-log record format: framing constants, encoder and decoder.

The grammar and a worked example are in ``docs/storage-format.md``; keep the
two in step. All integers are big-endian. A record is::

    0   u32  total_size        bytes of the whole record, this field included
    4   u32  magic             MESSAGE_MAGIC, or BLANK_MAGIC for segment filler
    8   u32  crc               CRC-32 (zlib) of bytes [12, total_size)
    12  i32  queue_id
    16  i32  flags
    20  i64  queue_offset
    28  i64  commit_log_offset  where this record starts in the commit log
    36  i32  sys_flag
    40  i64  born_timestamp     milliseconds since the epoch
    48  i64  store_timestamp    milliseconds since the epoch
    56  i32  reconsume_times
    60  i64  prepared_transaction_offset
    68  u32  body_length        then the body
    ..  u8   topic_length       then the topic (ASCII)
    ..  u8   born_host_length   then the born host (UTF-8, "host:port")
    ..  u8   store_host_length  then the store host
    ..  u16  properties_length  then the properties

Properties are ``key \\x01 value \\x02`` repeated (RocketMQ's encoding), so
neither separator may appear in a key or value (see ``validate``).

A record never straddles two segments. When the next record does not fit in
what is left of a segment, the writer fills the rest with a blank record
(``total_size`` = bytes left, ``BLANK_MAGIC``) if at least ``BLANK_SIZE``
bytes are left, and leaves zeros otherwise; readers skip to the next segment
on either.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from halfmoon.store.message import Message, StoredMessage

MESSAGE_MAGIC = 0x484D3031  # "HM01"
BLANK_MAGIC = 0x484D4242  # "HMBB"

_HEADER = struct.Struct(">IIIiiqqiqqiqI")
HEADER_SIZE = _HEADER.size  # 72: everything up to and including body_length
BLANK_SIZE = 8  # total_size + magic: the smallest filler that can be framed
CRC_START = 12

_QUEUE_OFFSET_AT = 20
_STORE_FIELDS = struct.Struct(">qq")  # queue_offset, commit_log_offset at 20
_STORE_TIMESTAMP = struct.Struct(">q")  # at 48
_CRC = struct.Struct(">I")
_FRAME = struct.Struct(">II")  # total_size, magic
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")

PROPERTY_SEPARATOR = "\x01"
PAIR_SEPARATOR = "\x02"
MAX_TOPIC_BYTES = 255
MAX_HOST_BYTES = 255
MAX_PROPERTIES_BYTES = 65535


class RecordError(Exception):
    """A record that cannot be framed at a position (torn, corrupt or not a record)."""

    def __init__(self, reason: str, position: int, detail: str) -> None:
        super().__init__(f"{reason} at commit-log position {position}: {detail}")
        self.reason = reason
        self.position = position


def encode_properties(properties: dict[str, str]) -> bytes:
    if not properties:
        return b""
    return "".join(
        f"{k}{PROPERTY_SEPARATOR}{v}{PAIR_SEPARATOR}" for k, v in properties.items()
    ).encode("utf-8")


def decode_properties(raw: bytes) -> dict[str, str]:
    if not raw:
        return {}
    out: dict[str, str] = {}
    for pair in raw.decode("utf-8").split(PAIR_SEPARATOR):
        if pair:
            key, _, value = pair.partition(PROPERTY_SEPARATOR)
            out[key] = value
    return out


@dataclass(slots=True)
class PreparedRecord:
    """A record encoded up to the fields only the writer knows (offsets, store time).

    Encoding happens outside the commit log's lock; ``finalize`` patches the
    offsets and the store timestamp in and computes the CRC under it.
    """

    buffer: bytearray

    @property
    def size(self) -> int:
        return len(self.buffer)


def prepare(message: Message, store_host: str = "") -> PreparedRecord:
    """Encode ``message`` into a record with zero offsets and no CRC yet."""
    topic = message.topic.encode("ascii")
    born_host = message.born_host.encode("utf-8")
    store = store_host.encode("utf-8")
    props = encode_properties(message.properties)
    body = message.body
    if len(topic) > MAX_TOPIC_BYTES or len(born_host) > MAX_HOST_BYTES:
        raise ValueError("topic or host too long for the record format")
    if len(store) > MAX_HOST_BYTES or len(props) > MAX_PROPERTIES_BYTES:
        raise ValueError("store host or properties too long for the record format")
    total = HEADER_SIZE + len(body) + 1 + len(topic) + 1 + len(born_host) + 1 + len(store)
    total += 2 + len(props)
    head = _HEADER.pack(
        total,
        MESSAGE_MAGIC,
        0,
        message.queue_id,
        message.flags,
        0,
        0,
        message.sys_flag,
        message.born_timestamp,
        0,
        message.reconsume_times,
        message.prepared_transaction_offset,
        len(body),
    )
    buf = bytearray(head)
    buf += body
    buf += _U8.pack(len(topic))
    buf += topic
    buf += _U8.pack(len(born_host))
    buf += born_host
    buf += _U8.pack(len(store))
    buf += store
    buf += _U16.pack(len(props))
    buf += props
    return PreparedRecord(buf)


def finalize(
    record: PreparedRecord, queue_offset: int, commit_log_offset: int, store_timestamp: int
) -> bytearray:
    """Fill in what the writer assigns and seal the record with its CRC."""
    buf = record.buffer
    _STORE_FIELDS.pack_into(buf, _QUEUE_OFFSET_AT, queue_offset, commit_log_offset)
    _STORE_TIMESTAMP.pack_into(buf, 48, store_timestamp)
    _CRC.pack_into(buf, 8, zlib.crc32(memoryview(buf)[CRC_START:]))
    return buf


def encode(
    message: Message,
    queue_offset: int,
    commit_log_offset: int,
    store_timestamp: int,
    store_host: str = "",
) -> bytes:
    """Encode a whole record in one call (tests, tools)."""
    return bytes(finalize(prepare(message, store_host), queue_offset, commit_log_offset, store_timestamp))


def blank(size: int) -> bytes:
    """The filler that closes a segment: ``size`` bytes, ``size >= BLANK_SIZE``."""
    return _FRAME.pack(size, BLANK_MAGIC) + bytes(size - BLANK_SIZE)


def frame_at(buf: bytes | bytearray | memoryview, position: int, limit: int) -> tuple[int, int]:
    """Return (total_size, magic) of the record at ``position`` without checking its CRC.

    ``limit`` is where readable data ends. Raises :class:`RecordError` when
    fewer than ``BLANK_SIZE`` bytes remain or the size is impossible.
    """
    if limit - position < BLANK_SIZE:
        raise RecordError("truncated", position, "not enough bytes for a record frame")
    total, magic = _FRAME.unpack_from(buf, position)
    if magic == BLANK_MAGIC:
        if total < BLANK_SIZE or position + total > limit:
            raise RecordError("bad_length", position, f"blank record of {total} bytes")
        return total, magic
    if magic != MESSAGE_MAGIC:
        raise RecordError("bad_magic", position, f"magic {magic:#010x}")
    if total < HEADER_SIZE + 7:
        raise RecordError("bad_length", position, f"record of {total} bytes is too short")
    if position + total > limit:
        raise RecordError("truncated", position, f"record of {total} bytes runs past {limit}")
    return total, magic


def check_crc(buf: bytes | bytearray | memoryview, position: int, total: int) -> bool:
    (stored,) = _CRC.unpack_from(buf, position + 8)
    return stored == zlib.crc32(memoryview(buf)[position + CRC_START : position + total])


def decode(
    buf: bytes | bytearray | memoryview,
    position: int = 0,
    limit: int | None = None,
    *,
    verify: bool = True,
    base_offset: int = 0,
) -> StoredMessage:
    """Decode the message record at ``position`` of ``buf``.

    ``base_offset`` is the commit-log offset of ``buf[0]``, only used in error
    messages. Raises :class:`RecordError` on a blank, torn or corrupt record.
    """
    if limit is None:
        limit = len(buf)
    where = base_offset + position
    try:
        total, magic = frame_at(buf, position, limit)
    except RecordError as exc:
        raise RecordError(exc.reason, where, str(exc).split(": ", 1)[-1]) from None
    if magic == BLANK_MAGIC:
        raise RecordError("blank", where, "end-of-segment filler")
    if verify and not check_crc(buf, position, total):
        raise RecordError("checksum", where, "CRC mismatch")
    (
        _total,
        _magic,
        _crc,
        queue_id,
        flags,
        queue_offset,
        commit_log_offset,
        sys_flag,
        born_timestamp,
        store_timestamp,
        reconsume_times,
        prepared_offset,
        body_length,
    ) = _HEADER.unpack_from(buf, position)
    end = position + total
    p = position + HEADER_SIZE
    try:
        body = bytes(buf[p : p + body_length])
        p += body_length
        n = buf[p]
        topic = bytes(buf[p + 1 : p + 1 + n]).decode("ascii")
        p += 1 + n
        n = buf[p]
        born_host = bytes(buf[p + 1 : p + 1 + n]).decode("utf-8")
        p += 1 + n
        n = buf[p]
        store_host = bytes(buf[p + 1 : p + 1 + n]).decode("utf-8")
        p += 1 + n
        (n,) = _U16.unpack_from(buf, p)
        properties = decode_properties(bytes(buf[p + 2 : p + 2 + n]))
        p += 2 + n
    except (IndexError, UnicodeDecodeError, struct.error) as exc:
        raise RecordError("bad_fields", where, f"fields do not parse: {exc}") from None
    if p != end or len(body) != body_length:
        raise RecordError("bad_fields", where, "field lengths disagree with the record size")
    return StoredMessage(
        topic=topic,
        body=body,
        queue_id=queue_id,
        queue_offset=queue_offset,
        commit_log_offset=commit_log_offset,
        size=total,
        properties=properties,
        flags=flags,
        sys_flag=sys_flag,
        born_timestamp=born_timestamp,
        born_host=born_host,
        store_timestamp=store_timestamp,
        store_host=store_host,
        reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared_offset,
    )
