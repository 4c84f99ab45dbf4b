"""The client's own address, also when the connection reached gRPC through a splice.

In ``tls.mode=permissive`` the public port belongs to a front listener
(:mod:`halfmoon.server.permissive_grpc`) that relays each connection to one
of two loopback listeners of the gRPC server, so gRPC sees the relay's
loopback address as the peer. The relay binds its side of each connection
to a port of its own before connecting and records here, before sending a
byte, which real client that port stands for; :func:`client_peer` turns
gRPC's peer back into the client's. ACL source-IP rules, the audit log,
born hosts and session listings all read the peer through it.

Why a table and not the PROXY protocol: grpcio's server cannot parse one.
An explicitly bound port is held by the relay's socket for the connection's
whole life, so no other socket can claim it meanwhile. After the relay
closes, the entry lives on for ``FORGET_AFTER`` seconds, so that requests
gRPC reads from the connection's last bytes still resolve to the client.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from typing import Protocol

FORGET_AFTER = 30.0


class _HasPeer(Protocol):
    def peer(self) -> str: ...


def grpc_peer(host: str, port: int) -> str:
    """An address as gRPC writes peers: ``ipv4:10.0.0.7:5555``, ``ipv6:[::1]:5555``.

    An IPv4-mapped IPv6 address (a dual-stack listener's IPv4 client) is
    written as the IPv4 address it is, so IPv4 source rules match it."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return f"ipv4:{host}:{port}"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if isinstance(address, ipaddress.IPv6Address):
        return f"ipv6:[{address}]:{port}"
    return f"ipv4:{address}:{port}"


class SplicedPeers:
    """Relay-side gRPC peer (``ipv4:127.0.0.1:PORT``) → the real client's gRPC peer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[str, str] = {}
        self._closed: dict[str, tuple[str, float]] = {}

    def remember(self, relay_peer: str, client: str) -> None:
        with self._lock:
            self._closed.pop(relay_peer, None)
            self._live[relay_peer] = client

    def closed(self, relay_peer: str, client: str) -> None:
        """The relay's connection ended; keep the entry ``FORGET_AFTER`` seconds more."""
        now = time.monotonic()
        with self._lock:
            if self._live.get(relay_peer) == client:
                del self._live[relay_peer]
                self._closed[relay_peer] = (client, now + FORGET_AFTER)
            for key, (_, until) in list(self._closed.items()):
                if until < now:
                    del self._closed[key]

    def resolve(self, peer: str) -> str:
        with self._lock:
            client = self._live.get(peer)
            if client is None:
                remembered = self._closed.get(peer)
                client = remembered[0] if remembered is not None else None
        return client if client is not None else peer

    def __len__(self) -> int:
        with self._lock:
            return len(self._live)


SPLICED = SplicedPeers()


def client_peer(context: _HasPeer) -> str:
    """gRPC's ``context.peer()``, with a permissive-mode relay replaced by its client."""
    peer = context.peer() or ""
    return SPLICED.resolve(peer) if peer.startswith("ipv4:127.") else peer
