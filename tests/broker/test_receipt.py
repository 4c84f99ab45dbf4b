"""Receipt handles: round trip, and every malformed or forged text rejected cleanly."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from halfmoon.broker.receipt import (
    MAX_INVISIBLE_MS,
    MIN_RECEIVE_INVISIBLE_MS,
    IllegalInvisibleTime,
    InvalidReceiptHandle,
    ReceiptCodec,
    ReceiptHandle,
    check_invisible_ms,
    new_receipt_key,
)
from halfmoon.errors import InvalidArgument

CODEC = ReceiptCodec(b"k" * 16)
HANDLE = ReceiptHandle("orders", 3, 1234, 2**50 + 7, 1_700_000_030_000, 987_654)

handles = st.builds(
    ReceiptHandle,
    topic=st.text(max_size=120),
    queue_id=st.integers(0, 2**32 - 1),
    queue_offset=st.integers(0, 2**63 - 1),
    epoch=st.integers(0, 2**64 - 1),
    visible_at=st.integers(0, 2**63 - 1),
    commit_log_offset=st.integers(0, 2**63 - 1),
)


def test_errors_are_invalid_arguments_with_stable_codes() -> None:
    assert issubclass(InvalidReceiptHandle, InvalidArgument)
    assert issubclass(IllegalInvisibleTime, InvalidArgument)
    assert InvalidReceiptHandle("x").code == "INVALID_RECEIPT_HANDLE"
    assert IllegalInvisibleTime("x").code == "ILLEGAL_INVISIBLE_TIME"


@given(handles)
def test_round_trip(handle: ReceiptHandle) -> None:
    text = CODEC.encode(handle)
    assert text.isascii()
    assert set(text) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert CODEC.decode(text) == handle


@settings(max_examples=500)
@given(st.text(max_size=300))
def test_random_text_is_rejected(text: str) -> None:
    with pytest.raises(InvalidReceiptHandle):
        CODEC.decode(text)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_well_formed_base64_is_rejected(raw: bytes) -> None:
    text = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    with pytest.raises(InvalidReceiptHandle):
        CODEC.decode(text)


@settings(max_examples=300)
@given(st.data())
def test_any_changed_character_is_rejected(data: st.DataObject) -> None:
    text = CODEC.encode(HANDLE)
    index = data.draw(st.integers(0, len(text) - 1))
    replacement = data.draw(st.characters())
    changed = text[:index] + replacement + text[index + 1 :]
    if changed != text:
        with pytest.raises(InvalidReceiptHandle):
            CODEC.decode(changed)


def test_truncated_and_extended_handles_are_rejected() -> None:
    text = CODEC.encode(HANDLE)
    for cut in range(len(text)):
        with pytest.raises(InvalidReceiptHandle):
            CODEC.decode(text[:cut])
    for extra in ("A", "=", "==", " ", "\n", "!"):
        with pytest.raises(InvalidReceiptHandle):
            CODEC.decode(text + extra)


def test_non_canonical_spelling_is_rejected() -> None:
    text = CODEC.encode(HANDLE)
    # The decoder would skip these characters; the codec must not.
    for spelled in (text[:4] + "\n" + text[4:], text + "=", " " + text):
        with pytest.raises(InvalidReceiptHandle):
            CODEC.decode(spelled)


def test_handle_forged_with_another_key_is_rejected() -> None:
    forged = ReceiptCodec(new_receipt_key()).encode(HANDLE)
    with pytest.raises(InvalidReceiptHandle):
        CODEC.decode(forged)


@pytest.mark.parametrize("value", [None, b"bytes", 42, "", "x" * 100_000])
def test_non_text_and_oversized_input_is_rejected(value: object) -> None:
    with pytest.raises(InvalidReceiptHandle):
        CODEC.decode(value)


def test_invisible_time_bounds() -> None:
    check_invisible_ms(MIN_RECEIVE_INVISIBLE_MS, MIN_RECEIVE_INVISIBLE_MS)
    check_invisible_ms(MAX_INVISIBLE_MS, MIN_RECEIVE_INVISIBLE_MS)
    check_invisible_ms(0, 0)
    assert MIN_RECEIVE_INVISIBLE_MS == 10_000
    assert MAX_INVISIBLE_MS == 12 * 3600 * 1000
    for bad in (MIN_RECEIVE_INVISIBLE_MS - 1, MAX_INVISIBLE_MS + 1, -5):
        with pytest.raises(IllegalInvisibleTime) as caught:
            check_invisible_ms(bad, MIN_RECEIVE_INVISIBLE_MS)
        assert str(bad) in caught.value.message
    for bad in (1.5, "100", None, True):
        with pytest.raises(IllegalInvisibleTime):
            check_invisible_ms(bad, 0)  # type: ignore[arg-type]
