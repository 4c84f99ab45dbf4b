"""halfmoon/amqp/authentication.py: PLAIN and AMQPLAIN responses, malformed ones refused."""

from __future__ import annotations

import pytest
from pamqp import encode

from halfmoon.amqp.authentication import credentials
from halfmoon.amqp.reply_codes import ACCESS_REFUSED, AmqpConnectionError


def test_plain_and_amqplain_give_user_and_password() -> None:
    assert credentials("PLAIN", b"\x00bob\x00s3cret") == ("bob", "s3cret")
    table = encode.field_table({"LOGIN": "bob", "PASSWORD": "s3cret"})[4:]  # no length prefix
    assert credentials("AMQPLAIN", table) == ("bob", "s3cret")


@pytest.mark.parametrize(
    ("mechanism", "response"),
    [("PLAIN", b"bob"), ("PLAIN", b"\x00\xff\x00x"), ("AMQPLAIN", b"\x05LOGIN"),
     ("AMQPLAIN", b""), ("EXTERNAL", b"")],
)  # fmt: skip
def test_malformed_responses_and_other_mechanisms_are_refused(
    mechanism: str, response: bytes
) -> None:
    with pytest.raises(AmqpConnectionError) as info:
        credentials(mechanism, response)
    assert info.value.code == ACCESS_REFUSED
