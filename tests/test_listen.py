"""The asyncio listeners' sockets: connections accepted on them have Nagle off.

Without TCP_NODELAY a reply the server writes as two small segments (an AMQP
publisher confirm, then the delivery it caused) is held until the client's
delayed ACK, 40 ms on Linux, so every publish-to-delivery round trip took 44 ms.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from halfmoon.listen import listening_socket


async def _accepted_nodelay(host: str) -> int:
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    sock = listening_socket(host, 0)
    port = sock.getsockname()[1]
    server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
    try:
        _, writer = await asyncio.open_connection(host, port)
        try:
            return await asyncio.wait_for(accepted, 10)
        finally:
            writer.close()
    finally:
        server.close()
        await server.wait_closed()


def test_a_connection_accepted_on_a_listening_socket_has_nagle_off() -> None:
    assert asyncio.run(_accepted_nodelay("127.0.0.1")) != 0


def test_a_dual_stack_listener_turns_nagle_off_too() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    assert asyncio.run(_accepted_nodelay("::1")) != 0
