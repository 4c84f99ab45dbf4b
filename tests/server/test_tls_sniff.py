"""The first byte tells TLS from plaintext: real ClientHellos against real plaintext openings."""

from __future__ import annotations

import ssl

import pytest

from halfmoon.listen.tls_sniff import is_tls


def client_hello(version: ssl.TLSVersion) -> bytes:
    """The bytes a real TLS client sends first (Python's OpenSSL, as gRPC's BoringSSL would)."""
    context = ssl.create_default_context()
    context.minimum_version = context.maximum_version = version
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="halfmoon.test")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_client_hello_is_tls(version: ssl.TLSVersion) -> None:
    hello = client_hello(version)
    assert is_tls(hello) and is_tls(hello[:1])


@pytest.mark.parametrize(
    "opening",
    [
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # gRPC's plaintext (HTTP/2 prior knowledge)
        b"GET /healthz HTTP/1.1\r\n",
        b"POST /v1/topics HTTP/1.1\r\n",
        b"\x00",
    ],
)
def test_plaintext_openings_are_not_tls(opening: bytes) -> None:
    assert not is_tls(opening)


def test_every_tls_record_type_and_only_those() -> None:
    assert [b for b in range(256) if is_tls(bytes([b]))] == [20, 21, 22, 23]


def test_nothing_to_look_at_is_an_error() -> None:
    with pytest.raises(ValueError):
        is_tls(b"")
