"""Opening the listeners' ports, with one clear error when a port cannot be had.

grpc's ``add_insecure_port`` / ``add_secure_port`` answer 0 for an address
they cannot bind in some versions and raise a bare ``RuntimeError`` in
others; either way the process should stop with one clear line (the CLI's
``cannot start: … (UNAVAILABLE)``), not a traceback (:func:`add_port`). The
asyncio listeners (admin, AMQP, the permissive gRPC front) bind their own
sockets (:func:`listening_socket`); :mod:`tls_sniff` and :mod:`permissive`
serve plaintext and TLS on one port in ``tls.mode=permissive``.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable


def add_port(add: Callable[[str], int], address: str) -> int:
    """``add(address)``, the bound port; :class:`OSError` when nothing could be bound."""
    try:
        bound = add(address)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise OSError(
            errno.EADDRINUSE, f"cannot listen on {address} (address in use or not available)"
        )
    return bound


def listening_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound, listening, non-blocking TCP socket whose connections have Nagle off. An IPv6
    host (``::`` included) gets a dual-stack socket, as gRPC's own listeners do, so IPv4
    clients reach it as well."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose
    # ``proto`` says TCP, and accepted sockets inherit it. Without it a reply written as two
    # small segments (an AMQP confirm, then a delivery) waits for the peer's delayed ACK:
    # 40 ms per message.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host or "0.0.0.0", port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    return sock
