"""What every group of the gRPC servicer's RPCs shares: the worker pool, the
request helpers, and the decorator that turns any failure of a unary RPC into a Status.

The servicer's RPCs are grouped by idea over a few modules (routes and sends
in :mod:`halfmoon.server.grpc_service`, client sessions in
:mod:`halfmoon.server.client_rpc`, pop consumption in
:mod:`halfmoon.server.pop_rpc`, pull consumption in
:mod:`halfmoon.server.pull_rpc`); each group is an object built from the parts
it uses, and ``MessagingServicer`` holds the groups and hands each RPC to its own.
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

from halfmoon.broker.facade_types import Answer, Written
from halfmoon.config import ServerConfig
from halfmoon.server import convert
from halfmoon.server import namespace as ns
from halfmoon.server.client_address import client_peer
from halfmoon.server.errors import RequestError, ok, status_for

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
        async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
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


class Workers:
    """The thread pool the RPCs hand their blocking broker calls to, so the event loop
    stays free for the parked long polls."""

    def __init__(self, executor: ThreadPoolExecutor) -> None:
        self._executor = executor

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def written(self, answer: Answer[T]) -> Written[T]:
        """A ``*_nowait`` answer written: as it is when Written, on a worker when Pending."""
        return answer if isinstance(answer, Written) else await answer.written(self.call)


def poll_budget(
    config: ServerConfig,
    asked: duration_pb2.Duration | None,
    context: grpc.aio.ServicerContext,
) -> float:
    """How long a long poll may wait: what the client asked (else the default), within the
    configured maximum and answered before the client's own deadline."""
    seconds = config.long_polling_default
    if asked is not None:
        seconds = convert.duration_ms(asked) / 1000
    seconds = min(max(seconds, 0.0), config.long_polling_max)
    remaining = context.time_remaining()
    if remaining is not None:
        seconds = min(seconds, remaining - _DEADLINE_MARGIN)
    return max(seconds, 0.0)
