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

A record stored once for several queues (a fanout) has ``SysFlag.DESTINATIONS``
set in ``sys_flag`` and, after the properties, the list of its other
destinations; the header's topic, queue id and queue offset are its first::

    ..  u16  destination_count
    then per destination:
        u8   shared            bytes its topic shares with the previous one's (the
                               header's topic for the first), as leveldb's blocks
                               share key prefixes: queues bound together are
                               often named alike
        u8   suffix_length     then the rest of the topic (ASCII)
        i32  queue_id
        i64  queue_offset      filled in by the writer, as the header's is

Every destination gets its own consume-queue entry pointing at the one
record. Records without the flag are byte for byte what they always were.

A record never straddles two segments. When the next record does not fit in
what is left of a segment, the writer fills the rest with a blank record
(``total_size`` = bytes left, ``BLANK_MAGIC``) if at least ``BLANK_SIZE``
bytes are left, and leaves zeros otherwise; readers skip to the next segment
on either.
"""

from __future__ import annotations

import functools
import mmap
import operator
import struct
import zlib
from dataclasses import dataclass
from typing import NoReturn

from halfmoon.store.message import Message, StoredMessage, SysFlag

# -- the format: every magic number, field position and struct of the framing.
# The commit log, recovery and tools take these from here, never by number.

MESSAGE_MAGIC = 0x484D3031  # "HM01"
BLANK_MAGIC = 0x484D4242  # "HMBB"

FRAME = struct.Struct(">II")  # total_size, magic: how every record and filler starts
BLANK_SIZE = FRAME.size  # 8: the smallest filler that can be framed
MAGIC_AT = 4
CRC_AT = 8
CRC = struct.Struct(">I")
CRC_START = 12  # the CRC covers bytes [CRC_START, total_size)
QUEUE_OFFSET_AT = 20
COMMIT_LOG_OFFSET_AT = 28
SYS_FLAG_AT = 36
STORE_TIMESTAMP_AT = 48
STORE_FIELDS = struct.Struct(">qq")  # queue_offset, commit_log_offset, at QUEUE_OFFSET_AT
I64 = struct.Struct(">q")  # one i64 field (commit_log_offset, store_timestamp)

_HEADER = struct.Struct(">IIIiiqqiqqiqI")
HEADER_SIZE = _HEADER.size  # 72: everything up to and including body_length
# The header as encode_unsealed writes it: what the writer fills in later (crc,
# queue and commit-log offsets, store timestamp) is zero padding, not packed.
_UNSEALED_HEADER = struct.Struct(">II4xii16xiq8xiqI")
MIN_RECORD_SIZE = HEADER_SIZE + 5  # header, then topic, host and properties lengths (1+1+1+2)
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_DESTINATION = struct.Struct(">iq")  # queue_id, queue_offset after a destination's topic
DESTINATIONS_FLAG = SysFlag.DESTINATIONS.value
MAX_DESTINATIONS = 65535


def _field_at(index: int) -> int:
    """Byte position of the header's field number ``index`` (0 is total_size)."""
    return struct.calcsize(">" + _HEADER.format[1 : 1 + index])


# The named positions must agree with the header struct (and the table above).
assert _UNSEALED_HEADER.size == HEADER_SIZE
assert (_field_at(1), _field_at(2), _field_at(3)) == (MAGIC_AT, CRC_AT, CRC_START)
assert (_field_at(5), _field_at(6)) == (QUEUE_OFFSET_AT, COMMIT_LOG_OFFSET_AT)
assert (_field_at(7), _field_at(9)) == (SYS_FLAG_AT, STORE_TIMESTAMP_AT)

# What records are read from: a segment's mapping, or bytes copied out of one.
Buffer = bytes | bytearray | memoryview | mmap.mmap

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
    parts: list[str] = []
    for key, value in properties.items():
        parts += (key, PROPERTY_SEPARATOR, value, PAIR_SEPARATOR)
    return "".join(parts).encode("utf-8")


_split_pair = operator.methodcaller("split", PROPERTY_SEPARATOR, 1)


def decode_properties(raw: bytes) -> dict[str, str]:
    if not raw:
        return {}
    pairs = raw.decode("utf-8").split(PAIR_SEPARATOR)
    if not pairs[-1]:
        pairs.pop()  # the separator that ends the last pair
    try:
        # The read path's fast form, all in C: it fails (ValueError) on any
        # pair without a PROPERTY_SEPARATOR, including an empty one, and then
        # the loop below decodes the odd record the same way it always has.
        return dict(map(_split_pair, pairs))
    except ValueError:
        pass
    out: dict[str, str] = {}
    for pair in pairs:
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


@functools.lru_cache(maxsize=4096)
def _names(topic: str, born_host: str, store_host: str) -> bytes:
    """The length-prefixed topic and hosts, which repeat from message to message."""
    t = topic.encode("ascii")
    b = born_host.encode("utf-8")
    s = store_host.encode("utf-8")
    if len(t) > MAX_TOPIC_BYTES or len(b) > MAX_HOST_BYTES or len(s) > MAX_HOST_BYTES:
        raise ValueError("topic or host too long for the record format")
    return bytes((len(t),)) + t + bytes((len(b),)) + b + bytes((len(s),)) + s


@functools.lru_cache(maxsize=4096)
def _decode_names(raw: bytes) -> tuple[str, str, str]:
    """Inverse of :func:`_names`; cached because the same few names repeat."""
    a = raw[0]
    b = raw[1 + a]
    topic = raw[1 : 1 + a].decode("ascii")
    born_host = raw[2 + a : 2 + a + b].decode("utf-8")
    store_host = raw[3 + a + b :].decode("utf-8")
    return topic, born_host, store_host


def prepare(
    message: Message, store_host: str = "", encoded_properties: bytes | None = None
) -> PreparedRecord:
    """Encode ``message`` into a record with zero offsets and no CRC yet.

    ``encoded_properties`` may pass :func:`encode_properties` output computed
    earlier (validation measures it) so it is not encoded twice.
    """
    return PreparedRecord(encode_unsealed(message, store_host, encoded_properties))


def encode_unsealed(
    message: Message, store_host: str = "", encoded_properties: bytes | None = None
) -> bytearray:
    """:func:`prepare` without the wrapper object: the store's append path uses the buffer."""
    props = (
        encode_properties(message.properties) if encoded_properties is None else encoded_properties
    )
    return _pack_unsealed(
        message.topic,
        message.queue_id,
        message.flags,
        message.sys_flag,
        message.born_timestamp,
        message.born_host,
        message.reconsume_times,
        message.prepared_transaction_offset,
        message.body,
        props,
        store_host,
    )


def encode_unsealed_plain(
    topic: str,
    queue_id: int,
    born_timestamp: int,
    born_host: str,
    body: bytes,
    properties: bytes,
    store_host: str = "",
) -> bytearray:
    """:func:`encode_unsealed` of a message whose other header fields are zero (flags, system
    flag, reconsume times, prepared transaction offset: a producer's plain send), from its
    properties already encoded. Byte for byte what ``encode_unsealed`` makes of it."""
    return _pack_unsealed(
        topic, queue_id, 0, 0, born_timestamp, born_host, 0, 0, body, properties, store_host
    )


def _pack_unsealed(
    topic: str,
    queue_id: int,
    flags: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: str,
    reconsume_times: int,
    prepared_transaction_offset: int,
    body: bytes,
    props: bytes,
    store_host: str,
) -> bytearray:
    if len(props) > MAX_PROPERTIES_BYTES:
        raise ValueError("properties too long for the record format")
    if sys_flag & DESTINATIONS_FLAG:
        raise ValueError("sys_flag bit DESTINATIONS is set by the store only (add_destinations)")
    names = _names(topic, born_host, store_host)
    head = _UNSEALED_HEADER.pack(
        HEADER_SIZE + len(body) + len(names) + 2 + len(props),
        MESSAGE_MAGIC,
        queue_id,
        flags,
        sys_flag,
        born_timestamp,
        reconsume_times,
        prepared_transaction_offset,
        len(body),
    )
    return bytearray().join((head, body, names, _U16.pack(len(props)), props))


def add_destinations(
    buffer: bytearray, topic: str, destinations: list[tuple[str, int]]
) -> list[int]:
    """Make the unsealed record of one queue (``topic``'s) a record of several: set the
    flag, append the list of its other ``destinations`` and fix the size. Returns where
    each destination's queue offset is, for the writer to fill in before sealing."""
    if not 0 < len(destinations) <= MAX_DESTINATIONS:
        raise ValueError(f"a record names 1 to {MAX_DESTINATIONS} other destinations")
    (sys_flag,) = _I32.unpack_from(buffer, SYS_FLAG_AT)
    _I32.pack_into(buffer, SYS_FLAG_AT, sys_flag | DESTINATIONS_FLAG)
    buffer += _U16.pack(len(destinations))
    positions = []
    previous = topic.encode("ascii")
    for name, queue_id in destinations:
        raw = name.encode("ascii")
        if len(raw) > MAX_TOPIC_BYTES:
            raise ValueError("topic too long for the record format")
        shared = _shared_prefix(previous, raw)
        buffer += bytes((shared, len(raw) - shared)) + raw[shared:]
        positions.append(len(buffer) + 4)
        buffer += _DESTINATION.pack(queue_id, 0)
        previous = raw
    FRAME.pack_into(buffer, 0, len(buffer), MESSAGE_MAGIC)
    return positions


def _shared_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def fill_destination_offset(buffer: bytearray, position: int, queue_offset: int) -> None:
    I64.pack_into(buffer, position, queue_offset)


def _decode_destinations(raw: bytes, topic: str) -> tuple[tuple[str, int, int], ...]:
    """The destination list after a record's properties, whose header names ``topic``
    (raises IndexError, struct.error, UnicodeDecodeError or ValueError when it does not
    parse exactly)."""
    (count,) = _U16.unpack_from(raw, 0)
    position = 2
    found = []
    previous = topic.encode("ascii")
    for _ in range(count):
        shared, n = raw[position], raw[position + 1]
        suffix = raw[position + 2 : position + 2 + n]
        if shared > len(previous) or len(suffix) != n:
            raise ValueError("destination topic runs past the record or its predecessor")
        name = previous[:shared] + suffix
        queue_id, queue_offset = _DESTINATION.unpack_from(raw, position + 2 + n)
        found.append((name.decode("ascii"), queue_id, queue_offset))
        position += 2 + n + _DESTINATION.size
        previous = name
    if position != len(raw) or not found:
        raise ValueError("destination list length disagrees with the record size")
    return tuple(found)


def seal(
    buffer: bytearray, queue_offset: int, commit_log_offset: int, store_timestamp: int
) -> None:
    """Fill in what the writer assigns and compute the CRC, in place."""
    STORE_FIELDS.pack_into(buffer, QUEUE_OFFSET_AT, queue_offset, commit_log_offset)
    I64.pack_into(buffer, STORE_TIMESTAMP_AT, store_timestamp)
    CRC.pack_into(buffer, CRC_AT, zlib.crc32(memoryview(buffer)[CRC_START:]))


def finalize(
    record: PreparedRecord, queue_offset: int, commit_log_offset: int, store_timestamp: int
) -> bytearray:
    """Fill in what the writer assigns and seal the record with its CRC."""
    seal(record.buffer, queue_offset, commit_log_offset, store_timestamp)
    return record.buffer


def encode(
    message: Message,
    queue_offset: int,
    commit_log_offset: int,
    store_timestamp: int,
    store_host: str = "",
) -> bytes:
    """Encode a whole record in one call (tests, tools)."""
    return bytes(
        finalize(prepare(message, store_host), queue_offset, commit_log_offset, store_timestamp)
    )


def blank(size: int) -> bytes:
    """The filler that closes a segment: ``size`` bytes, ``size >= BLANK_SIZE``."""
    return FRAME.pack(size, BLANK_MAGIC) + bytes(size - BLANK_SIZE)


def frame_at(buf: Buffer, position: int, limit: int) -> tuple[int, int]:
    """Return (total_size, magic) of the record at ``position`` without checking its CRC.

    ``limit`` is where readable data ends. Raises :class:`RecordError` when
    fewer than ``BLANK_SIZE`` bytes remain or the size is impossible.
    """
    if limit - position < BLANK_SIZE:
        raise RecordError("truncated", position, "not enough bytes for a record frame")
    total: int
    magic: int
    total, magic = FRAME.unpack_from(buf, position)
    if magic == BLANK_MAGIC:
        if total < BLANK_SIZE or position + total > limit:
            raise RecordError("bad_length", position, f"blank record of {total} bytes")
        return total, magic
    if magic != MESSAGE_MAGIC:
        raise RecordError("bad_magic", position, f"magic {magic:#010x}")
    if total < MIN_RECORD_SIZE:
        raise RecordError("bad_length", position, f"record of {total} bytes is too short")
    if position + total > limit:
        raise RecordError("truncated", position, f"record of {total} bytes runs past {limit}")
    return total, magic


def check_crc(buf: Buffer, position: int, total: int) -> bool:
    stored: int = CRC.unpack_from(buf, position + CRC_AT)[0]
    return stored == zlib.crc32(memoryview(buf)[position + CRC_START : position + total])


def decode(
    buf: Buffer,
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
    return decode_at(buf, position, len(buf) if limit is None else limit, verify, base_offset)


def decode_at(
    buf: Buffer,
    position: int,
    limit: int,
    verify: bool,
    base_offset: int,
) -> StoredMessage:
    """:func:`decode` with positional arguments only: the read path calls it per message.

    One header unpack, one slice for the body and one for everything after
    it (hosts, topic, properties), which is then parsed as bytes.
    """
    try:
        (
            total,
            magic,
            crc,
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
    except struct.error:
        total = magic = 0
    end = position + total
    if magic != MESSAGE_MAGIC or total < MIN_RECORD_SIZE or end > limit:
        _raise_frame_error(buf, position, limit, base_offset)
    # Decode from an immutable copy. An mmap is read in place when no CRC is
    # checked (the read path: one copy less); slicing either yields bytes.
    data: bytes | mmap.mmap
    if type(buf) is bytes or (type(buf) is mmap.mmap and not verify):
        data = buf
    else:
        data = bytes(buf[position:end])
        position, end = 0, total
    if verify and crc != zlib.crc32(memoryview(data)[position + CRC_START : end]):
        raise RecordError("checksum", base_offset + position, "CRC mismatch")
    p = position + HEADER_SIZE + body_length
    body = data[position + HEADER_SIZE : p]
    tail = data[p:end]  # topic_length topic born_host... properties_length properties
    try:
        a = tail[0]
        b = tail[1 + a]
        q = 3 + a + b + tail[2 + a + b]
        topic, born_host, store_host = _decode_names(tail[:q])
        n = (tail[q] << 8) | tail[q + 1]
        if n:
            raw = tail[q + 2 : q + 2 + n]
            # decode_properties' fast form, inlined (see there).
            pairs = raw.decode("utf-8").split(PAIR_SEPARATOR)
            if not pairs[-1]:
                pairs.pop()
            try:
                properties = dict(map(_split_pair, pairs))
            except ValueError:
                properties = decode_properties(raw)
        else:
            properties = {}
        fields_end = q + 2 + n
        destinations: tuple[tuple[str, int, int], ...] = ()
        if sys_flag & DESTINATIONS_FLAG:
            destinations = _decode_destinations(tail[fields_end:], topic)
            sys_flag &= ~DESTINATIONS_FLAG
            fields_end = len(tail)  # _decode_destinations checked the list ends the record
    except (IndexError, UnicodeDecodeError, ValueError, struct.error) as exc:
        raise RecordError(
            "bad_fields", base_offset + position, f"fields do not parse: {exc}"
        ) from None
    if fields_end != len(tail) or len(body) != body_length:
        raise RecordError(
            "bad_fields", base_offset + position, "field lengths disagree with the record size"
        )
    return StoredMessage(
        topic,
        body,
        queue_id,
        queue_offset,
        commit_log_offset,
        total,
        properties,
        flags,
        sys_flag,
        born_timestamp,
        born_host,
        store_timestamp,
        store_host,
        reconsume_times,
        prepared_offset,
        destinations,
    )


def _raise_frame_error(buf: Buffer, position: int, limit: int, base_offset: int) -> NoReturn:
    """Say precisely why no message record can be framed at ``position``."""
    where = base_offset + position
    try:
        _total, magic = frame_at(buf, position, limit)
    except RecordError as exc:
        raise RecordError(exc.reason, where, str(exc).split(": ", 1)[-1]) from None
    if magic == BLANK_MAGIC:
        raise RecordError("blank", where, "end-of-segment filler")
    raise RecordError("truncated", where, "record header runs past the readable data")
