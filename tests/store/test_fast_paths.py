"""The append and read fast paths give the same answers as the slow, explicit ones."""

from __future__ import annotations

import mmap

import pytest

from halfmoon.store import Message, record
from halfmoon.store.validate import (
    IllegalPropertyKey,
    IllegalPropertyValue,
    check_message,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"a\x01b\x02", {"a": "b"}),
        (b"a\x01b\x02c\x01d\x02", {"a": "b", "c": "d"}),
        (b"a\x01b\x01c\x02", {"a": "b\x01c"}),  # a second separator belongs to the value
        (b"a\x02c\x01d\x02", {"a": "", "c": "d"}),  # a pair without separator: empty value
        (b"a\x01b\x02\x02c\x01d\x02", {"a": "b", "c": "d"}),  # empty pairs are skipped
        (b"a\x01b", {"a": "b"}),  # no final pair separator
        (b"a\x011\x02a\x012\x02", {"a": "2"}),  # the last duplicate wins
    ],
)
def test_decode_properties_odd_forms(raw, expected):
    assert record.decode_properties(raw) == expected


@pytest.mark.parametrize(
    ("properties", "error"),
    [
        ({"": "v"}, IllegalPropertyKey),
        ({"k\x01": "v"}, IllegalPropertyKey),
        ({"k": "v\x02"}, IllegalPropertyValue),
        ({"a": "1", "k": "v\x01w"}, IllegalPropertyValue),
        ({1: "v"}, IllegalPropertyKey),
        ({"k": 1}, IllegalPropertyValue),
        ({"k": None}, IllegalPropertyValue),
    ],
)
def test_check_message_names_the_bad_property(properties, error):
    with pytest.raises(error):
        check_message(Message(topic="t", body=b"", properties=properties), 1024, 1024)


def test_check_message_returns_the_encoded_properties():
    properties = {"TAGS": "a", "KEYS": "k1 k2", "UNIQ_KEY": "é"}
    encoded = check_message(Message(topic="t", body=b"", properties=properties), 1024, 1024)
    assert encoded == record.encode_properties(properties)
    assert check_message(Message(topic="t", body=b""), 1024, 1024) == b""


def test_decode_reads_a_mapping_in_place_like_a_copy():
    message = Message(topic="orders", body=b"x" * 300, queue_id=3, properties={"TAGS": "t"})
    raw = record.encode(message, 7, 4096, 1700000000005, "10.0.0.1:8081")
    mm = mmap.mmap(-1, 8192)
    try:
        mm[100 : 100 + len(raw)] = raw
        in_place = record.decode(mm, 100, 100 + len(raw), verify=False)
        assert in_place == record.decode(raw)
        mm[100 + len(raw) - 1] ^= 0xFF  # damage the last property byte
        with pytest.raises(record.RecordError):
            record.decode(mm, 100, 100 + len(raw), verify=True)
    finally:
        mm.close()


def test_new_append_result_is_an_ordinary_frozen_append_result():
    import dataclasses

    from halfmoon.store.api import AppendResult, new_append_result

    built = new_append_result("t", 1, 2, 3, 4, 5)
    plain = AppendResult("t", 1, 2, 3, 4, 5)
    assert type(built) is AppendResult
    assert built == plain and hash(built) == hash(plain) and repr(built) == repr(plain)
    assert built.end_offset == 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.size = 9  # type: ignore[misc]
