"""The MQv2-HMAC-SHA1 signature: the official clients' exact headers verify, anything else not."""

from __future__ import annotations

import calendar
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from halfmoon.auth import signature
from halfmoon.auth.errors import Unauthenticated

SECRET = "s3cret-key"
STAMP = "20261124T194608Z"
NOW = calendar.timegm(time.strptime(STAMP, "%Y%m%dT%H%M%SZ"))


def headers(value: str, date_time: str = STAMP) -> dict[str, str]:
    return {"authorization": value, "x-mq-date-time": date_time}


def test_python_client_header_verifies():
    # As rocketmq/v5/util/signature.py builds it: lowercase hex.
    value = signature.authorization_header("alice", SECRET, STAMP)
    request = signature.parse(headers(value))
    assert request.access_key == "alice"
    assert signature.verifies(request, SECRET)
    assert not signature.verifies(request, SECRET + "x")


def test_node_client_uppercase_hex_verifies():
    sig = signature.sign(SECRET, STAMP).upper()
    value = f"MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature={sig}"
    assert signature.verifies(signature.parse(headers(value)), SECRET)


def test_empty_credential_is_no_credentials():
    value = "MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature=abcd"
    with pytest.raises(Unauthenticated, match="no credentials"):
        signature.parse(headers(value))


@pytest.mark.parametrize(
    "value",
    [
        "",
        "Basic YWxpY2U6cw==",
        "MQv2-HMAC-SHA1",
        "MQv2-HMAC-SHA1 Credential=alice, Signature=zz",
        "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time",
        "MQv2-HMAC-SHA1 Credential=alice, Signature=" + "a" * 2000,
    ],
)
def test_malformed_headers_are_unauthenticated(value):
    with pytest.raises(Unauthenticated):
        signature.parse(headers(value))


def test_missing_date_time_is_unauthenticated():
    value = signature.authorization_header("alice", SECRET, STAMP)
    with pytest.raises(Unauthenticated, match="x-mq-date-time"):
        signature.parse({"authorization": value})


def test_stamp_parsing_matches_strptime_and_refuses_junk():
    assert signature.stamp_seconds(STAMP) == NOW
    for junk in (
        "20261324T000000Z",
        "2026112XT194608Z",
        "20261124 194608Z",
        "",
        "٢٠٢٦1124T194608Z",
    ):
        assert signature.stamp_seconds(junk) is None


def test_window_accepts_utc_and_listed_offsets_only():
    assert signature.within_window(STAMP, NOW + 299, 300, [0])
    assert not signature.within_window(STAMP, NOW + 301, 300, [0])  # replayed later
    assert not signature.within_window(STAMP, NOW - 301, 300, [0])  # from the future
    # A Python client at +08:00 stamps local time with a Z: 8 hours "ahead".
    local = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(NOW + 8 * 3600))
    assert not signature.within_window(local, NOW, 300, [0])
    assert signature.within_window(local, NOW, 300, [0, 8 * 3600])
    assert not signature.within_window("not-a-date", NOW, 300, [0])


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.text(max_size=40))
def test_fuzzed_headers_never_crash_and_never_verify(value, date_time):
    try:
        request = signature.parse(headers(value, date_time))
    except Unauthenticated:
        return
    # Whatever parsed, it is not a valid signature of its date by our secret
    # (hypothesis does not find HMACs).
    assert not signature.verifies(request, SECRET)
