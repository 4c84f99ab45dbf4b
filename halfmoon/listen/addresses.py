"""How a listener's address is written, and which host others are told to dial.

A listener on a wildcard host (``0.0.0.0``, ``::``) accepts on every
interface, but nobody can dial the wildcard: what a process registers for
its peers (a broker in etcd, a cluster proxy's endpoint) names this machine
instead, unless an advertised host is configured.
"""

from __future__ import annotations

import socket

# Hosts that mean "every interface" to bind, and nothing to dial.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def format_address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def advertised_host(
    listen_host: str, advertise_host: str | None, *, wildcard: str | None = None
) -> str:
    """The host others are told to dial: the advertised one when configured, else the listen
    host, else (a wildcard) ``wildcard``, by default this machine's fully qualified name (what
    a peer on another machine needs; ``serve``'s routes answer loopback instead)."""
    if advertise_host:
        return advertise_host
    if listen_host not in WILDCARD_HOSTS:
        return listen_host
    return socket.getfqdn() if wildcard is None else wildcard
