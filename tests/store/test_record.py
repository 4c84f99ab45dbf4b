import mmap
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from halfmoon.store import record
from halfmoon.store.message import Message

_name = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789%_-", min_size=1, max_size=127)
_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    max_size=20,
)
_i32 = st.integers(-(2**31), 2**31 - 1)
_i64 = st.integers(-(2**63), 2**63 - 1)

messages = st.builds(
    Message,
    topic=_name,
    body=st.binary(max_size=2048),
    queue_id=st.integers(0, 2**31 - 1),
    properties=st.dictionaries(_text.filter(bool), _text, max_size=6),
    flags=_i32,
    sys_flag=_i32.map(lambda f: f & ~record.DESTINATIONS_FLAG),  # the bit is the store's
    born_timestamp=_i64,
    born_host=_text,
    reconsume_times=_i32,
    prepared_transaction_offset=_i64,
)


@settings(max_examples=300, deadline=None)
@given(messages, st.integers(0, 2**62), st.integers(0, 2**62), _i64, _text)
def test_round_trip(message, queue_offset, commit_log_offset, store_timestamp, store_host):
    data = record.encode(message, queue_offset, commit_log_offset, store_timestamp, store_host)
    decoded = record.decode(data)
    assert decoded.size == len(data)
    for name in (
        "topic",
        "body",
        "queue_id",
        "properties",
        "flags",
        "sys_flag",
        "born_timestamp",
        "born_host",
        "reconsume_times",
        "prepared_transaction_offset",
    ):
        assert getattr(decoded, name) == getattr(message, name)
    assert (decoded.queue_offset, decoded.commit_log_offset) == (queue_offset, commit_log_offset)
    assert (decoded.store_timestamp, decoded.store_host) == (store_timestamp, store_host)


@settings(max_examples=100, deadline=None)
@given(messages, st.data())
def test_any_flipped_byte_is_detected(message, data):
    raw = bytearray(record.encode(message, 1, 2, 3, "h:1"))
    position = data.draw(st.integers(0, len(raw) - 1))
    raw[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(record.RecordError):
        record.decode(bytes(raw))


@settings(max_examples=100, deadline=None)
@given(messages, st.data())
def test_truncated_record_is_detected(message, data):
    raw = record.encode(message, 1, 2, 3)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(record.RecordError) as info:
        record.decode(raw[:cut])
    assert info.value.reason in ("truncated", "bad_length")


@given(st.dictionaries(_text.filter(bool), _text, max_size=8))
def test_properties_round_trip(properties):
    assert record.decode_properties(record.encode_properties(properties)) == properties


def test_crc_covers_everything_after_the_crc_field():
    raw = record.encode(Message(topic="t", body=b"hello"), 0, 0, 0)
    assert int.from_bytes(raw[8:12], "big") == zlib.crc32(raw[12:])


def test_blank_is_framed_but_is_not_a_message():
    filler = record.blank(100)
    assert record.frame_at(filler, 0, 100) == (100, record.BLANK_MAGIC)
    with pytest.raises(record.RecordError) as info:
        record.decode(filler)
    assert info.value.reason == "blank"


def test_decode_reads_from_memoryview_and_offset():
    raw = record.encode(Message(topic="t", body=b"abc", properties={"TAGS": "x"}), 5, 9, 7)
    buf = memoryview(b"\0" * 10 + raw)
    decoded = record.decode(buf, 10)
    assert decoded.body == b"abc" and decoded.tags == "x" and type(decoded.body) is bytes


def test_error_reports_commit_log_position():
    raw = bytearray(record.encode(Message(topic="t", body=b"abc"), 0, 0, 0))
    raw[-1] ^= 1
    with pytest.raises(record.RecordError) as info:
        record.decode(bytes(raw), base_offset=4096)
    assert info.value.position == 4096 and info.value.reason == "checksum"


def test_named_field_positions_read_what_encode_wrote():
    raw = record.encode(Message(topic="t", body=b"abc"), 7, 4096, 1_700_000_000_005)
    assert record.FRAME.unpack_from(raw, 0) == (len(raw), record.MESSAGE_MAGIC)
    assert raw[record.MAGIC_AT : record.MAGIC_AT + 4] == b"HM01"
    assert record.STORE_FIELDS.unpack_from(raw, record.QUEUE_OFFSET_AT) == (7, 4096)
    assert record.I64.unpack_from(raw, record.COMMIT_LOG_OFFSET_AT) == (4096,)
    assert record.I64.unpack_from(raw, record.STORE_TIMESTAMP_AT) == (1_700_000_000_005,)
    (crc,) = record.CRC.unpack_from(raw, record.CRC_AT)
    assert crc == zlib.crc32(raw[record.CRC_START :])


def test_decode_from_bytearray_and_mmap_without_verify():
    raw = record.encode(Message(topic="t", body=b"abc", properties={"TAGS": "x"}), 5, 9, 7)
    with mmap.mmap(-1, len(raw) + 10) as mm:
        mm[10 : 10 + len(raw)] = raw
        for buf, verify in ((bytearray(raw), True), (mm, False), (mm, True)):
            position = 10 if buf is mm else 0
            decoded = record.decode(buf, position, verify=verify)
            assert decoded.body == b"abc" and type(decoded.body) is bytes
            assert decoded.tags == "x" and decoded.commit_log_offset == 9
