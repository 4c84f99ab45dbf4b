"""Is this connection TLS? The answer from its first byte, as RocketMQ's proxy decides.

A TLS client speaks first, and its first bytes are a TLS record header: a
content type (20 change_cipher_spec, 21 alert, 22 handshake, 23
application_data; a ClientHello is 22), then the protocol's major version 3.
Netty's ``SslHandler.isEncrypted``, which RocketMQ's proxy asks in its
permissive mode, checks that header. Nothing a plaintext client of ours
sends starts with those bytes: HTTP/2's connection preface starts with
``PRI``, an HTTP/1 request with an ASCII method name. So the first byte is
enough to tell them apart, and a listener never has to wait for more.
"""

from __future__ import annotations

from halfmoon.metrics import default_registry

# Operators watch the plaintext count fall to zero before they switch to enforcing.
CONNECTIONS = default_registry().counter(
    "halfmoon_permissive_connections_total",
    "Connections accepted in tls.mode=permissive, by what their first byte said.",
    ("listener", "transport"),
)

TLS_CONTENT_TYPES = frozenset((20, 21, 22, 23))


def is_tls(first: bytes) -> bool:
    """True when ``first`` (a connection's first bytes, at least one) opens a TLS record."""
    if not first:
        raise ValueError("is_tls needs at least the connection's first byte")
    return first[0] in TLS_CONTENT_TYPES


def count(listener: str, tls: bool) -> None:
    """One more connection of ``listener`` (grpc, admin, amqp) sniffed as TLS or plaintext."""
    CONNECTIONS.inc(listener=listener, transport="tls" if tls else "plaintext")
