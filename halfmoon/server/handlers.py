"""Registering the servicer with grpc, decoding requests ourselves.

grpc's generated registration decodes each request before the servicer
runs; an undecodable one never reaches it and grpc logs a traceback per
request (a cheap way for a hostile client to flood the log) and answers
with a bare transport error. Here every method takes raw bytes and decodes
them itself, so a request that does not parse gets the protocol's answer:
the method's response with a BAD_REQUEST status naming the problem.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from rocketmq.grpc_protocol import service_pb2

from halfmoon.lifecycle import CallsInFlight
from halfmoon.metrics import default_registry
from halfmoon.server.errors import Code, status
from halfmoon.server.rpc_guard import RpcGuard

SERVICE = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
RPCS = default_registry().counter(
    "halfmoon_grpc_requests_total",
    "gRPC requests answered, by method and protocol status code.",
    ("method", "code"),
)
DURATION = default_registry().histogram(
    "halfmoon_grpc_request_duration_seconds",
    "Time to answer unary gRPC requests (SendMessage: the send latency), by method.",
    ("method",),
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


# Built once: ``Code.values()`` / ``Code.Name`` build lists and raise on unknown numbers.
_CODE_NAMES = {value.number: value.name for value in Code.DESCRIPTOR.values}


# (method, code number) -> the counter's label values, built on first use.
_KEYS: dict[tuple[str, int], tuple[str, str]] = {}


def _count(method: str, response: Message) -> None:
    if response.HasField("status"):  # type: ignore[arg-type]
        code = response.status.code  # type: ignore[attr-defined]
        key = _KEYS.get((method, code))
        if key is None:
            key = _KEYS.setdefault((method, code), (method, _CODE_NAMES.get(code) or str(code)))
        RPCS.inc_key(key)


def _types(method: Any) -> tuple[type[Message], type[Message]]:
    return getattr(service_pb2, method.input_type.name), getattr(
        service_pb2, method.output_type.name
    )


def _decode(request_type: type[Message], raw: bytes) -> Message | str:
    """The request, or a sentence saying why it does not parse."""
    try:
        return request_type.FromString(raw)
    except (DecodeError, ValueError, RuntimeError) as exc:
        return f"request does not parse as {request_type.DESCRIPTOR.name}: {exc}"


def _unary(
    handler: Callable,
    request_type: type[Message],
    response_type: type[Message],
    guard: RpcGuard | None,
    calls: CallsInFlight,
) -> Callable:
    method = handler.__name__
    key = (method,)

    async def run(raw: bytes, context: grpc.aio.ServicerContext) -> Message:
        started = time.perf_counter()
        request = _decode(request_type, raw)
        if isinstance(request, str):
            response = response_type(status=status(Code.BAD_REQUEST, request))
        elif guard is not None and (denied := guard.check(method, request, context)):
            response = response_type(status=denied)
        else:
            calls.enter()
            try:
                response = await handler(request, context)
            finally:
                calls.leave()
        _count(method, response)
        DURATION.observe_key(key, time.perf_counter() - started)
        return response

    return run


def _server_stream(
    handler: Callable,
    request_type: type[Message],
    response_type: type[Message],
    guard: RpcGuard | None,
    calls: CallsInFlight,
) -> Callable:
    method = handler.__name__

    async def run(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Message]:
        request = _decode(request_type, raw)
        denied = None
        if isinstance(request, str):
            denied = status(Code.BAD_REQUEST, request)
        elif guard is not None:
            denied = guard.check(method, request, context)
        if denied is not None:
            response = response_type(status=denied)
            _count(method, response)
            yield response
            return
        counted = False
        calls.enter()
        try:
            async for response in handler(request, context):
                if not counted and response.HasField("status"):  # type: ignore[arg-type]
                    _count(method, response)
                    counted = True
                yield response
        finally:
            calls.leave()

    return run


def _bidi_stream(
    handler: Callable,
    request_type: type[Message],
    response_type: type[Message],
    guard: RpcGuard | None,
    calls: CallsInFlight,
) -> Callable:
    method = handler.__name__

    async def run(
        raw_requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Message]:
        # A stream is authenticated once, at its start (its metadata); nothing to authorize.
        if guard is not None and (denied := guard.check(method, None, context)):
            yield response_type(status=denied)
            return

        async def decoded() -> AsyncIterator[Message | str]:
            # An undecodable frame comes through as the sentence saying why: the
            # handler answers it on the stream and carries on.
            async for raw in raw_requests:
                yield _decode(request_type, raw)

        calls.enter()
        try:
            async for response in handler(decoded(), context):
                yield response
        finally:
            calls.leave()

    return run


def messaging_handler(
    servicer: Any, guard: RpcGuard | None = None, calls: CallsInFlight | None = None
) -> grpc.GenericRpcHandler:
    """A generic handler serving every MessagingService method of ``servicer``; ``guard``
    (authentication on) checks every request before its handler runs; ``calls`` counts the
    calls its handlers are running (what a shutdown waits for, then cancels)."""
    calls = calls if calls is not None else CallsInFlight()
    handlers = {}
    for method in SERVICE.methods:
        request_type, response_type = _types(method)
        handler = getattr(servicer, method.name)
        serialize = response_type.SerializeToString
        if not method.client_streaming and not method.server_streaming:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _unary(handler, request_type, response_type, guard, calls),
                response_serializer=serialize,
            )
        elif not method.client_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                _server_stream(handler, request_type, response_type, guard, calls),
                response_serializer=serialize,
            )
        else:
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                _bidi_stream(handler, request_type, response_type, guard, calls),
                response_serializer=serialize,
            )
    return grpc.method_handlers_generic_handler(SERVICE.full_name, handlers)
