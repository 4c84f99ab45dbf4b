"""``tls.mode=permissive`` for gRPC: plaintext and TLS clients on one public port.

grpcio's server cannot look at a connection's first bytes before choosing
its handshake, which is how RocketMQ's proxy serves both on one port (a
Netty decoder asks ``SslHandler.isEncrypted`` and installs the TLS or the
plaintext handler). So halfmoon puts a front listener on the public port
and gives the gRPC server two loopback listeners of its own, one TLS (with
the reloadable certificate: SIGHUP works as in ``enforcing``) and one
plaintext. For each accepted connection the front waits for the first byte
(:func:`halfmoon.listen.tls_sniff.is_tls`), connects to the matching inner
listener and relays bytes both ways until either side closes. The TLS
session is still between the client and gRPC's own TLS stack: the front
never decrypts anything and holds no key.

The client's address survives the relay through
:data:`halfmoon.server.client_address.SPLICED` (the relay's inner port →
the client), recorded before the first byte is relayed.

Limits: a connection that says nothing for ``sniff_timeout`` seconds is
closed; the relay applies flow control both ways (a side whose peer does not
read is paused, so a slow reader cannot make the front buffer without bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import cast

from halfmoon.listen import listening_socket
from halfmoon.listen.tls_sniff import count, is_tls
from halfmoon.server.client_address import SPLICED, SplicedPeers, grpc_peer

log = logging.getLogger("halfmoon.server")

INNER_HOST = "127.0.0.1"
SNIFF_TIMEOUT = 10.0


class _Relay:
    """One client connection and, once its first byte has arrived, its inner connection."""

    def __init__(self, front: PermissiveFront) -> None:
        self.front = front
        self.client: asyncio.Transport | None = None
        self.inner: asyncio.Transport | None = None
        self.pending = bytearray()  # bytes read before the inner connection was open
        self.client_eof = False  # the client sent FIN (reading it is done, writing is not)
        self.inner_eof = False
        self.closed = False
        self.real_peer = ""
        self.relay_peer = ""
        self.timer: asyncio.TimerHandle | None = None

    # -- the client's side ----------------------------------------------------------------

    def client_made(self, transport: asyncio.Transport) -> None:
        self.client = transport
        peername = transport.get_extra_info("peername")
        if isinstance(peername, tuple) and len(peername) >= 2:
            self.real_peer = grpc_peer(str(peername[0]), int(peername[1]))
        self.timer = self.front.loop.call_later(self.front.sniff_timeout, self._sniff_expired)

    def client_data(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.write(data)
            return
        first = not self.pending
        self.pending += data
        if first:
            assert self.client is not None
            self.client.pause_reading()  # until the inner connection is open
            tls = is_tls(data)
            count("grpc", tls)
            target = self.front.tls_target if tls else self.front.plain_target
            task = self.front.loop.create_task(self._connect(target))
            self.front.tasks.add(task)
            task.add_done_callback(self.front.tasks.discard)

    def client_eof_received(self) -> None:
        self.client_eof = True
        if self.inner is None:
            if not self.pending:
                self.close()  # went without a word
            return  # inner_made passes the EOF on after the pending bytes
        if self.inner_eof:
            self.close()  # both ways done: nobody will call connection_lost for us
        elif self.inner.can_write_eof():
            self.inner.write_eof()

    # -- the inner side ----------------------------------------------------------------

    async def _connect(self, target: tuple[str, int]) -> None:
        if self.timer is not None:
            self.timer.cancel()
        loop = self.front.loop
        # IPPROTO_TCP so asyncio turns Nagle off on the relay (see listen.listening_socket).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setblocking(False)
            # An explicit bind: the port is ours for the connection's life (see client_address).
            sock.bind((INNER_HOST, 0))
            self.relay_peer = grpc_peer(INNER_HOST, sock.getsockname()[1])
            self.front.peers.remember(self.relay_peer, self.real_peer)
            await loop.sock_connect(sock, target)
            await loop.create_connection(lambda: _InnerSide(self), sock=sock)
        except (OSError, asyncio.CancelledError) as exc:
            sock.close()
            if not isinstance(exc, asyncio.CancelledError):
                log.warning("event=permissive_inner_connect_failed target=%s error=%s", target, exc)
            self.close()
            if isinstance(exc, asyncio.CancelledError):
                raise

    def inner_made(self, transport: asyncio.Transport) -> None:
        if self.closed or self.client is None:
            transport.close()
            return
        self.inner = transport
        transport.write(bytes(self.pending))
        self.pending.clear()
        if self.client_eof:
            if transport.can_write_eof():
                transport.write_eof()
        else:
            self.client.resume_reading()

    def inner_data(self, data: bytes) -> None:
        if self.client is not None:
            self.client.write(data)

    def inner_eof_received(self) -> None:
        self.inner_eof = True
        if self.client_eof:
            self.close()
        elif self.client is not None and self.client.can_write_eof():
            self.client.write_eof()

    # -- flow control and the end ------------------------------------------------------

    def pause_reading_from(self, transport: asyncio.Transport | None) -> None:
        if transport is not None and not transport.is_closing():
            transport.pause_reading()

    def resume_reading_from(self, transport: asyncio.Transport | None) -> None:
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    def _sniff_expired(self) -> None:
        if self.inner is None and not self.pending:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
        # close() sends what is buffered first, so the last replies still reach the client.
        for transport in (self.client, self.inner):
            if transport is not None:
                transport.close()
        if self.relay_peer:
            self.front.peers.closed(self.relay_peer, self.real_peer)
        self.front.relays.discard(self)

    def abort(self) -> None:
        for transport in (self.client, self.inner):
            if transport is not None:
                transport.abort()
        self.close()


class _ClientSide(asyncio.Protocol):
    def __init__(self, front: PermissiveFront) -> None:
        self.relay = _Relay(front)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.relay.front.relays.add(self.relay)
        self.relay.client_made(cast(asyncio.Transport, transport))  # a stream's (uvloop's too)

    def data_received(self, data: bytes) -> None:
        self.relay.client_data(data)

    def eof_received(self) -> bool:
        self.relay.client_eof_received()
        return True  # keep the other direction open until the inner side finishes

    def pause_writing(self) -> None:  # the client reads slowly: stop reading from gRPC
        self.relay.pause_reading_from(self.relay.inner)

    def resume_writing(self) -> None:
        self.relay.resume_reading_from(self.relay.inner)

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.close()


class _InnerSide(asyncio.Protocol):
    def __init__(self, relay: _Relay) -> None:
        self.relay = relay

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.relay.inner_made(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        self.relay.inner_data(data)

    def eof_received(self) -> bool:
        self.relay.inner_eof_received()
        return True

    def pause_writing(self) -> None:  # gRPC reads slowly: stop reading from the client
        self.relay.pause_reading_from(self.relay.client)

    def resume_writing(self) -> None:
        self.relay.resume_reading_from(self.relay.client)

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.close()


class PermissiveFront:
    """The public port of ``tls.mode=permissive``: sniff, then relay to ``tls_target`` or
    ``plain_target`` (the gRPC server's loopback listeners)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls_target: tuple[str, int],
        plain_target: tuple[str, int],
        reuse_port: bool = False,
        sniff_timeout: float = SNIFF_TIMEOUT,
        peers: SplicedPeers = SPLICED,
    ) -> None:
        self.host, self.port = host, port
        self.tls_target, self.plain_target = tls_target, plain_target
        self.reuse_port = reuse_port
        self.sniff_timeout = sniff_timeout
        self.peers = peers
        self.relays: set[_Relay] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "start() first"
        return self._loop

    async def bind(self) -> int:
        """Bind the public port (accepting starts with :meth:`serve`); the bound port."""
        self._loop = asyncio.get_running_loop()
        sock = listening_socket(self.host, self.port, reuse_port=self.reuse_port)
        self._server = await self._loop.create_server(
            lambda: _ClientSide(self), sock=sock, start_serving=False
        )
        return int(sock.getsockname()[1])

    async def serve(self) -> None:
        assert self._server is not None, "bind() first"
        await self._server.start_serving()

    def stop_accepting(self) -> None:
        """No new connections; the open ones go on (gRPC's graceful stop ends them)."""
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """Stop accepting and drop every relay still open."""
        self.stop_accepting()
        for task in list(self.tasks):
            task.cancel()
        for relay in list(self.relays):
            relay.abort()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
