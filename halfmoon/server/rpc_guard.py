"""The gRPC edge of authentication and authorization: one check before any handler runs.

:func:`halfmoon.server.handlers.messaging_handler` calls :meth:`RpcGuard.check`
with every decoded request; a denial becomes the method's response with an
UNAUTHORIZED or FORBIDDEN status, and the handler never runs. The signature
and the policies are :class:`halfmoon.auth.Guard`'s business; this module
only reads the metadata, the peer and the request's names.

A request naming a client id (``x-mq-client-id``) another user is using is
refused FORBIDDEN (:mod:`halfmoon.server.client_owners`): a client id is not a
way into someone else's session.

For a telemetry stream the authenticated user's Pub permissions are handed
to the session (``PUBLISH_FILTER``), so transaction checks go only to
producers allowed to Pub on the message's topic.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2

from halfmoon.auth import Forbidden, Guard
from halfmoon.errors import HalfmoonError
from halfmoon.server import namespace as ns
from halfmoon.server.client_address import client_peer
from halfmoon.server.client_owners import ClientOwners
from halfmoon.server.errors import status_for
from halfmoon.server.rpc_permissions import needs

# Topics the caller of this RPC may Pub on (None: any); read by the Telemetry handler.
PUBLISH_FILTER: ContextVar[Callable[[str], bool] | None] = ContextVar(
    "halfmoon_publish_filter", default=None
)


def peer_ip(context: grpc.aio.ServicerContext) -> str:
    """``ipv4:10.0.0.5:5555`` → ``10.0.0.5``; ``ipv6:[::1]:5555`` → ``::1``."""
    _, _, rest = client_peer(context).partition(":")
    if rest.startswith("["):
        return rest[1:].partition("]")[0]
    return rest.rpartition(":")[0] or rest


class RpcGuard:
    def __init__(self, guard: Guard, owners: ClientOwners | None = None) -> None:
        self.guard = guard
        self.owners = owners or ClientOwners()

    def check(
        self, method: str, request: Any, context: grpc.aio.ServicerContext
    ) -> definition_pb2.Status | None:
        """None when ``request`` may proceed; else the Status to answer with."""
        guard = self.guard
        if not guard.enabled:
            return None
        metadata = {}
        for key, value in context.invocation_metadata() or ():
            metadata[key] = value if isinstance(value, str) else value.decode("utf-8", "replace")
        peer = peer_ip(context)
        try:
            user = guard.authenticate_signed(metadata, peer, method)
            client_id = metadata.get("x-mq-client-id")
            if client_id and not self.owners.claim(client_id, user.access_key):
                guard.audit_denial(user, peer, method, "client id of another user")
                raise Forbidden(
                    f"client id {client_id[:128]!r} is in use by another user ({method}); "
                    "give every client a client id of its own"
                )
            if request is not None:
                guard.authorize(
                    user, needs(method, request, metadata.get(ns.HEADER, "")), peer, method
                )
        except HalfmoonError as exc:
            return status_for(exc, method)
        PUBLISH_FILTER.set(guard.publish_filter(user, peer))
        return None
