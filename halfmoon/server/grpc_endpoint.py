"""The gRPC server's public port in each ``tls.mode``.

- ``disabled``: one plaintext listener on the public address.
- ``enforcing``: one TLS listener on the public address.
- ``permissive``: gRPC listens on two loopback ports (TLS and plaintext), and
  a :class:`~halfmoon.server.permissive_grpc.PermissiveFront` on the public
  address relays each connection to the one its first byte asks for.
"""

from __future__ import annotations

import logging

import grpc

from halfmoon.listen import add_port
from halfmoon.listen.addresses import format_address
from halfmoon.server.edge_security import Certificates
from halfmoon.server.permissive_grpc import INNER_HOST, PermissiveFront

log = logging.getLogger("halfmoon.server")


class GrpcEndpoint:
    """Construct (adds gRPC's ports) and :meth:`bind` before ``server.start()``,
    :meth:`serve` after it."""

    def __init__(
        self,
        server: grpc.aio.Server,
        host: str,
        port: int,
        listen: str,
        certificates: Certificates | None,
        *,
        reuse_port: bool = False,
    ) -> None:
        self.front: PermissiveFront | None = None
        self._bound = 0
        mode = certificates.tls.mode if certificates is not None else "disabled"
        if certificates is not None and mode == "permissive":
            if certificates.tls.client_ca is not None:
                log.warning(
                    "event=permissive_with_client_ca detail='TLS clients must present a "
                    "certificate; plaintext clients, allowed by tls.mode=permissive, present none'"
                )
            credentials = certificates.grpc_credentials()
            inner_tls = add_port(
                lambda a: server.add_secure_port(a, credentials), f"{INNER_HOST}:0"
            )
            inner_plain = add_port(server.add_insecure_port, f"{INNER_HOST}:0")
            self.front = PermissiveFront(
                host,
                port,
                tls_target=(INNER_HOST, inner_tls),
                plain_target=(INNER_HOST, inner_plain),
                reuse_port=reuse_port,
            )
            return
        address = format_address(host, port)
        if certificates is not None:
            credentials = certificates.grpc_credentials()
            self._bound = add_port(lambda a: server.add_secure_port(a, credentials), address)
        else:
            self._bound = add_port(server.add_insecure_port, address)

    async def bind(self) -> int:
        """The public port (the permissive front binds it here, not yet accepting)."""
        if self.front is not None:
            self._bound = await self.front.bind()
        return self._bound

    async def serve(self) -> None:
        """Accept on the public port (gRPC's own listeners accept from its start)."""
        if self.front is not None:
            await self.front.serve()

    def stop_accepting(self) -> None:
        if self.front is not None:
            self.front.stop_accepting()

    async def close(self) -> None:
        if self.front is not None:
            await self.front.close()
