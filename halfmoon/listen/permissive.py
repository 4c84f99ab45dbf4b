"""``tls.mode=permissive`` for the admin API (and the AMQP port): plaintext and TLS on one port.

Unlike gRPC, aiohttp can take over a socket someone else accepted, so no
relay is needed: the listener accepts, peeks at the first byte without
consuming it (``MSG_PEEK``; :func:`halfmoon.listen.tls_sniff.is_tls`) and hands
the socket to the admin application with or without the TLS context. The
application therefore sees the client's own address, and the context is the
one :class:`~halfmoon.server.edge_security.Certificates` reloads on SIGHUP.
The AMQP listener takes over its sockets the same way (an AMQP client's
first byte is the ``A`` of ``AMQP``, never a TLS record type).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable

from halfmoon.listen import listening_socket
from halfmoon.listen.tls_sniff import count, is_tls

log = logging.getLogger("halfmoon.server")

SNIFF_TIMEOUT = 10.0
HANDSHAKE_TIMEOUT = 10.0


class PermissiveAdminListener:
    """Accept on ``host:port``; serve each connection with ``protocol_factory`` (the admin
    application's ``web.Server``), over TLS when its first byte says so."""

    def __init__(
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: str,
        port: int,
        ssl_context: ssl.SSLContext,
        *,
        reuse_port: bool = False,
        sniff_timeout: float = SNIFF_TIMEOUT,
        sock: socket.socket | None = None,
        listener: str = "admin",
    ) -> None:
        """``listener``: its name in the log and in ``halfmoon_permissive_connections_total``."""
        self.protocol_factory = protocol_factory
        self.listener = listener
        self.ssl_context = ssl_context
        self.sniff_timeout = sniff_timeout
        # ``sock``: already bound to host:port (the server binds its ports before its store).
        self._sock = sock or listening_socket(host, port, reuse_port=reuse_port)
        self.port = int(self._sock.getsockname()[1])
        self._accepting: asyncio.Task[None] | None = None
        self._routing: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as exc:  # e.g. EMFILE: say so, keep the listener alive
                log.warning("event=%s_accept_failed error=%s", self.listener, exc)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._route(conn))
            self._routing.add(task)
            task.add_done_callback(self._routing.discard)

    async def _route(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            first = await asyncio.wait_for(_peek(loop, conn), self.sniff_timeout)
            if not first:  # closed before saying anything
                conn.close()
                return
            tls = is_tls(first)
            count(self.listener, tls)
            await loop.connect_accepted_socket(
                self.protocol_factory,
                conn,
                ssl=self.ssl_context if tls else None,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT if tls else None,
            )
        except (OSError, TimeoutError, ssl.SSLError):
            conn.close()  # silent, or a failed handshake: nothing to answer
        except asyncio.CancelledError:
            conn.close()
            raise

    async def close(self) -> None:
        """Stop accepting (connections already served are the application's to close)."""
        tasks = [t for t in (self._accepting, *self._routing) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._sock.close()


async def _peek(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bytes:
    """The first byte waiting on ``conn``, left unread; empty when the peer closed."""
    conn.setblocking(False)
    readable: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(conn.fileno(), wake)
    try:
        await readable
    finally:
        loop.remove_reader(conn.fileno())
    return conn.recv(1, socket.MSG_PEEK)
