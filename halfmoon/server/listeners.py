"""The front end's ports, bound before anything else of a server is opened.

``halfmoon serve`` binds its gRPC and admin ports before it opens the store:
a start whose port is taken fails in a line, before crash recovery has read
(or its shutdown written) a byte of the data directory. Neither port accepts
a call until the front end serves: a client that connects during recovery
waits in the listen backlog for the ready line.

gRPC binds when a port is added to its server (handlers may be added until it
starts); the admin application needs the broker, so its socket is bound here
and handed to aiohttp (or to the ``tls.mode=permissive`` sniffer) later.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass

import grpc

from halfmoon.config import Config, parse_host_port
from halfmoon.listen import listening_socket
from halfmoon.server.edge_security import Certificates
from halfmoon.server.grpc_endpoint import GrpcEndpoint


@dataclass
class Listeners:
    """Bound, not yet serving: the gRPC server with its public port and the admin socket."""

    server: grpc.aio.Server
    endpoint: GrpcEndpoint
    host: str  # the gRPC listen host, as configured
    grpc_port: int  # bound (the real port when 0 was asked for)
    certificates: Certificates | None
    admin_host: str
    admin_sock: socket.socket
    # The AMQP listener's socket (``server.amqp_listen``), when this server serves AMQP.
    amqp_sock: socket.socket | None = None
    amqp_host: str = ""

    @property
    def admin_port(self) -> int:
        return int(self.admin_sock.getsockname()[1])

    async def close(self) -> None:
        """Give the ports back when the server never got to serve."""
        try:
            await self.server.stop(0)
            await self.endpoint.close()
        finally:
            self.admin_sock.close()
            if self.amqp_sock is not None:
                self.amqp_sock.close()


async def bind_listeners(
    config: Config, *, reuse_port: bool = False, amqp: bool = False
) -> Listeners:
    """Bind ``server.listen`` then ``server.admin_listen`` (and, with ``amqp``,
    ``server.amqp_listen`` unless it is empty); :class:`OSError` (address in use) when one
    cannot be bound, with nothing left bound."""
    server_config = config.server
    host, port = parse_host_port(server_config.listen, what="listen address")
    admin_host, admin_port = parse_host_port(
        server_config.admin_listen, what="admin listen address"
    )
    certificates = Certificates(config.tls) if config.tls.mode != "disabled" else None
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", server_config.max_request_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
        ]
    )
    endpoint: GrpcEndpoint | None = None
    try:
        endpoint = GrpcEndpoint(
            server, host, port, server_config.listen, certificates, reuse_port=reuse_port
        )
        bound = await endpoint.bind()
        admin_sock = listening_socket(admin_host, admin_port, reuse_port=reuse_port)
        amqp_host, amqp_sock = "", None
        if amqp and server_config.amqp_listen:
            amqp_host, amqp_port = parse_host_port(
                server_config.amqp_listen, what="AMQP listen address"
            )
            try:
                amqp_sock = listening_socket(amqp_host, amqp_port, reuse_port=reuse_port)
            except BaseException:
                admin_sock.close()
                raise
    except BaseException:
        with contextlib.suppress(Exception):
            await server.stop(0)
        if endpoint is not None:
            with contextlib.suppress(Exception):
                await endpoint.close()
        raise
    return Listeners(
        server, endpoint, host, bound, certificates, admin_host, admin_sock, amqp_sock, amqp_host
    )
