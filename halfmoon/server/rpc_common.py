"""What every part of the gRPC servicer shares: the worker pool, the request
helpers, and the decorator that turns any failure of a unary RPC into a Status.

The servicer's RPCs are grouped by idea over a few modules (routes and sends
in :mod:`halfmoon.server.grpc_service`, client sessions in
:mod:`halfmoon.server.client_rpc`, pop consumption in
:mod:`halfmoon.server.pop_rpc`, pull consumption in
:mod:`halfmoon.server.pull_rpc`); each group is a class over
:class:`ServicerBase`, and ``MessagingServicer`` combines them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
from google.protobuf import duration_pb2
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2_grpc

from halfmoon.broker.facade import Broker, SendsAsync
from halfmoon.config import ServerConfig
from halfmoon.server import convert
from halfmoon.server import namespace as ns
from halfmoon.server.client_address import client_peer
from halfmoon.server.end_batching import EndBatcher
from halfmoon.server.errors import RequestError, ok, status_for
from halfmoon.server.longpoll import ArrivalNotifier
from halfmoon.server.renewal import Renewer
from halfmoon.server.telemetry import ClientRegistry

T = TypeVar("T")

# Answer a long poll this long before the client's deadline, so it gets an answer, not a timeout.
_DEADLINE_MARGIN = 0.3
# Built once and copied into each answer: ``ok()`` resolves ``Code.OK`` through
# protobuf's Python-level enum wrapper, a visible cost per message on the send path.
OK_STATUS = ok()


def metadata(context: grpc.aio.ServicerContext, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode("utf-8", "replace")
    return ""


def metadata_pair(context: grpc.aio.ServicerContext, first: str, second: str) -> tuple[str, str]:
    """Two headers in one pass: grpc builds the metadata tuple anew on every call."""
    found: dict[str, str] = {}
    for k, v in context.invocation_metadata() or ():
        if k in (first, second) and k not in found:  # the first of each, as metadata()
            found[k] = v if isinstance(v, str) else v.decode("utf-8", "replace")
    return found.get(first, ""), found.get(second, "")


def peer_host(context: grpc.aio.ServicerContext) -> str:
    peer = client_peer(context)  # the client's own, also behind tls.mode=permissive's relay
    # "ipv4:127.0.0.1:5555" / "ipv6:[::1]:5555"
    _, _, rest = peer.partition(":")
    return rest


def unary(response_type: type) -> Callable:
    """Wrap a unary handler: any exception becomes ``response_type(status=...)``."""

    def decorate(handler: Callable) -> Callable:
        rpc = handler.__name__

        @functools.wraps(handler)
        async def wrapper(
            self: ServicerBase, request: Any, context: grpc.aio.ServicerContext
        ) -> Any:
            try:
                return await handler(self, request, context)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - every error becomes a Status
                return response_type(status=status_for(exc, rpc))

        return wrapper

    return decorate


def resource_name(
    resource: pb.Resource, what: str, context: Any = None, header: str | None = None
) -> str:
    """The stored name a request's topic or group Resource stands for (its namespace applied)."""
    if not resource.name:
        raise RequestError(f"{what} is missing; set {what}.name")
    if header is None:
        header = metadata(context, ns.HEADER) if context is not None else ""
    return ns.resolve(resource, header, "group" if what.endswith("group") else "topic")


async def until_durable(durable: Future[None]) -> None:
    """Wait for a write's promise to hold; no loop wake-up when it already does (async flush).

    Each waiter wraps the future itself. Sharing one wrapper per fsync
    (shielded per RPC) was measured: sequential sync-flush sends got ~100 ms
    p99 outliers that the plain wrap does not have.
    """
    if durable.done():
        durable.result()
        return
    await asyncio.wrap_future(durable)


class ServicerBase(service_pb2_grpc.MessagingServiceServicer):
    """The state every RPC group uses: the broker facade, the client registry, the worker pool."""

    def __init__(
        self,
        broker: Broker,
        config: ServerConfig,
        registry: ClientRegistry,
        notifier: ArrivalNotifier,
        *,
        advertised: tuple[str, int],
        executor: ThreadPoolExecutor | None = None,
    ) -> None:
        self.broker = broker
        self.config = config
        self.registry = registry
        self.notifier = notifier
        self.advertised = advertised
        self._executor = executor or ThreadPoolExecutor(
            config.worker_threads, thread_name_prefix="halfmoon-rpc"
        )
        self.max_body_size = broker.config.max_body_size
        self.default_invisible_ms = broker.config.default_invisible_ms
        self.broker_name = broker.config.name
        # A broker a network hop away takes sends on the loop (coalesced there, no thread).
        self.send_async = broker.send_async if isinstance(broker, SendsAsync) else None
        # Invisible-time renewal for push consumers (auto_renew receives): renewal.py.
        self.renewer = Renewer(broker, config, self._call, self._has_stream)
        # EndTransactions of one loop turn decided with one append: end_batching.py.
        self._ends = EndBatcher(broker.end_transactions_nowait)

    def _has_stream(self, client_id: str) -> bool:
        session = self.registry.get(client_id)
        return session is not None and session.has_stream

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    # -- routes ----------------------------------------------------------------

    def _poll_budget(
        self, asked: duration_pb2.Duration | None, context: grpc.aio.ServicerContext
    ) -> float:
        seconds = self.config.long_polling_default
        if asked is not None:
            seconds = convert.duration_ms(asked) / 1000
        seconds = min(max(seconds, 0.0), self.config.long_polling_max)
        remaining = context.time_remaining()
        if remaining is not None:
            seconds = min(seconds, remaining - _DEADLINE_MARGIN)
        return max(seconds, 0.0)
