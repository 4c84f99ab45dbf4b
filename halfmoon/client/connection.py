"""Channels to the server: one grpc.aio channel per endpoint, the headers the protocol expects.

Every RPC carries the ``x-mq-*`` headers RocketMQ's proxy reads: the client
id (which ties calls to the client's telemetry session), language, protocol,
client version, a request id and the date-time. The static part is built
once per connection; only the request id and the (per-second cached) date
change per call, so the hot path allocates one small tuple.

Reconnecting is grpc's job at the transport level (its channel redials with
backoff; the options below keep that backoff short so a restarted server is
found within a second or two). On top of that, :meth:`Connection.call` can
retry an idempotent RPC that failed with "unavailable" with exponential
backoff until its deadline, which is what route and offset lookups use.
Sends are *not* retried here: the producer owns that policy.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2_grpc

from halfmoon.auth.signature import authorization_header
from halfmoon.client.credentials import Credentials
from halfmoon.client.endpoints import channel_target, endpoints_text, split_endpoints
from halfmoon.client.endpoints import endpoints_pb as endpoints_pb  # re-exported
from halfmoon.client.errors import ClientClosed, ConnectionFailed, error_for_rpc_error

CLIENT_VERSION = "halfmoon-0.1.0"
# Received batches may exceed grpc's 4 MiB default; the server bounds them anyway.
_MAX_RECEIVE = 64 * 1024 * 1024
_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", _MAX_RECEIVE),
    ("grpc.max_send_message_length", _MAX_RECEIVE),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.enable_retries", 0),
)


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: ``initial * multiplier ** (attempt - 1)``, capped at ``maximum``, with
    jitter."""

    initial: float = 0.1
    maximum: float = 3.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        base = min(self.initial * self.multiplier ** max(attempt - 1, 0), self.maximum)
        return base * (1 + random.uniform(-self.jitter, self.jitter)) if self.jitter else base


@dataclass
class ClientConfig:
    """What every client needs: where the server is and how long to wait for it.

    ``endpoints`` is ``host:port`` (or several, ``;``-separated, tried in turn for
    routes). ``request_timeout`` bounds each unary RPC (seconds). ``client_id`` is
    generated when omitted; it identifies this client's session on the server.
    ``credentials`` sign every request (a broker with ``auth.enabled``); ``tls``
    connects over TLS, trusting the system roots or the PEM bundle in
    ``tls_root_certificates``.
    """

    endpoints: str
    namespace: str = ""
    request_timeout: float = 3.0
    client_id: str = ""
    tls: bool = False
    credentials: Credentials | None = None
    tls_root_certificates: str | None = None
    reconnect_backoff: Backoff = field(default_factory=Backoff)
    heartbeat_interval: float = 10.0
    route_refresh_interval: float = 30.0

    def __post_init__(self) -> None:
        if not self.endpoints or not self.endpoints.strip():
            raise ValueError(
                "endpoints is empty; pass the server's gRPC address, e.g. '127.0.0.1:8081'"
            )
        if not self.client_id:
            self.client_id = new_client_id()

    @property
    def access_points(self) -> list[str]:
        return split_endpoints(self.endpoints)

    @property
    def access_point(self) -> str:
        """Every configured endpoint as one target: a channel that fails over between them."""
        return ";".join(self.access_points)


_client_seq = itertools.count()


def new_client_id() -> str:
    """``host@pid@seq@random``: unique per client object, readable in server logs."""
    return f"{socket.gethostname()}@{os.getpid()}@{next(_client_seq)}@{uuid.uuid4().hex[:8]}"


def endpoint_of(endpoints: pb.Endpoints) -> str:
    """``host:port`` of a protocol Endpoints, or every address ``;``-separated (a cluster's
    proxies: one access point that fails over between them)."""
    return endpoints_text(endpoints)


class _DateStamp:
    """``x-mq-date-time``, formatted once per second rather than once per call."""

    __slots__ = ("_second", "_text")

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def now(self) -> str:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._text = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second))
        return self._text


class Connection:
    """One channel and stub to one endpoint, shared by every client call to it."""

    def __init__(self, target: str, config: ClientConfig) -> None:
        self.target = target
        self.config = config
        grpc_target, target_options = channel_target(target)
        options = [*_CHANNEL_OPTIONS, *target_options]
        if config.tls:
            roots = None
            if config.tls_root_certificates:
                with open(config.tls_root_certificates, "rb") as bundle:
                    roots = bundle.read()
            self.channel = grpc.aio.secure_channel(
                grpc_target, grpc.ssl_channel_credentials(roots), options=options
            )
        else:
            self.channel = grpc.aio.insecure_channel(grpc_target, options=options)
        self.stub = service_pb2_grpc.MessagingServiceStub(self.channel)
        headers = [
            ("x-mq-client-id", config.client_id),
            ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "GRPC_V2"),
            ("x-mq-client-version", CLIENT_VERSION),
        ]
        if config.namespace:
            headers.append(("x-mq-namespace", config.namespace))
        self._static = tuple(headers)
        self._request_prefix = uuid.uuid4().hex[:12]
        self._request_seq = itertools.count()
        self._date = _DateStamp()
        self._credentials = config.credentials
        self._signed_at = ""
        self._authorization = ""
        self.closed = False

    def metadata(self, extra: tuple[tuple[str, str], ...] = ()) -> tuple[tuple[str, str], ...]:
        """Headers for one call (fresh request id and date), then ``extra`` (halfmoon's own);
        signed when credentials are set."""
        date = self._date.now()
        headers = (
            *self._static,
            ("x-mq-request-id", f"{self._request_prefix}-{next(self._request_seq)}"),
            ("x-mq-date-time", date),
            *extra,
        )
        if self._credentials is None:
            return headers
        if date != self._signed_at:  # one HMAC per second, as the stamp changes
            self._authorization = authorization_header(
                self._credentials.access_key, self._credentials.secret_key, date
            )
            self._signed_at = date
        return (*headers, ("authorization", self._authorization))

    async def call(
        self,
        rpc: str,
        request: Any,
        *,
        timeout: float | None = None,
        retry_unavailable: bool = False,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> Any:
        """Invoke the unary ``rpc`` (e.g. ``"SendMessage"``); transport errors become typed errors.

        With ``retry_unavailable`` (idempotent RPCs only), an unreachable server is
        retried with backoff until ``timeout`` has passed in total. ``headers`` are
        added to the call's metadata (halfmoon's extensions, which other servers ignore).
        """
        if self.closed:
            raise ClientClosed(f"the connection to {self.target} is closed", rpc=rpc)
        method = getattr(self.stub, rpc)
        timeout = self.config.request_timeout if timeout is None else timeout
        if not retry_unavailable:
            try:
                return await method(request, timeout=timeout, metadata=self.metadata(headers))
            except grpc.aio.AioRpcError as exc:
                raise error_for_rpc_error(exc, rpc, self.target) from None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - loop.time()
            try:
                return await method(
                    request, timeout=max(remaining, 0.05), metadata=self.metadata(headers)
                )
            except grpc.aio.AioRpcError as exc:
                error = error_for_rpc_error(exc, rpc, self.target)
                pause = self.config.reconnect_backoff.delay(attempt)
                if (
                    not isinstance(error, ConnectionFailed)
                    or loop.time() + pause >= deadline
                    or self.closed
                ):
                    raise error from None
                await asyncio.sleep(pause)

    async def call_raw(self, method: str, request: bytes, *, rpc: str, timeout: float) -> bytes:
        """Invoke a unary method of halfmoon's own services (``/halfmoon.v1.BulkRead/Read``):
        bytes in, bytes out, the same headers as every call."""
        if self.closed:
            raise ClientClosed(f"the connection to {self.target} is closed", rpc=rpc)
        call = self.channel.unary_unary(method)
        try:
            answer: bytes = await call(request, timeout=timeout, metadata=self.metadata())
        except grpc.aio.AioRpcError as exc:
            raise error_for_rpc_error(exc, rpc, self.target) from None
        return answer

    def stream(self, rpc: str, request: Any, *, timeout: float) -> AsyncIterator[Any]:
        """A server-streaming call (ReceiveMessage, PullMessage); iterate it for the responses."""
        if self.closed:
            raise ClientClosed(f"the connection to {self.target} is closed", rpc=rpc)
        return _typed_stream(
            getattr(self.stub, rpc)(request, timeout=timeout, metadata=self.metadata()),
            rpc,
            self.target,
        )

    def telemetry(self, requests: AsyncIterator[Any]) -> Any:
        """Open the bidirectional Telemetry stream fed by ``requests``."""
        return self.stub.Telemetry(requests, metadata=self.metadata())

    async def close(self) -> None:
        self.closed = True
        await self.channel.close(grace=0.2)


async def _typed_stream(call: Any, rpc: str, target: str) -> AsyncIterator[Any]:
    try:
        async for response in call:
            yield response
    except grpc.aio.AioRpcError as exc:
        raise error_for_rpc_error(exc, rpc, target) from None
    finally:
        call.cancel()


class ConnectionPool:
    """One :class:`Connection` per endpoint, created on first use."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._connections: dict[str, Connection] = {}
        self.closed = False

    def get(self, target: str) -> Connection:
        """The connection to ``host:port`` (created on first use)."""
        connection = self._connections.get(target)
        if connection is None:
            if self.closed:
                raise ClientClosed("the client is closed; create a new one")
            connection = Connection(target, self.config)
            self._connections[target] = connection
        return connection

    @property
    def access_point(self) -> Connection:
        """The connection to the configured endpoints (one channel failing over between them)."""
        return self.get(self.config.access_point)

    def all(self) -> list[Connection]:
        return list(self._connections.values())

    async def close(self) -> None:
        self.closed = True
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
