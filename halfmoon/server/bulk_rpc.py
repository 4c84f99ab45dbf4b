"""The ``halfmoon.v1.BulkRead`` service: a queue's committed messages, many per answer.

PullMessage answers one stream response (one protobuf Message) per record,
which is what the RocketMQ clients expect and what made a Spark read cost
~100 µs of server CPU per message. BulkRead answers a whole range at once in
the columnar msgpack format of :mod:`halfmoon.bulkread.format`, for halfmoon's
own readers (the Spark source, ``PullConsumer``); the official clients keep
using MessagingService.

The read is the broker's :meth:`~halfmoon.broker.facade.Broker.bulk_read`,
the pull path with bigger bounds, so it sees what PullMessage sees and no
more: only visible (durable under ``sync`` flush) records of the queue, never
half messages (they live in the half topic until committed), filters applied
by the broker, retention reported as OFFSET_TOO_SMALL. Authentication and
authorization are the same check as PullMessage's (Sub on the topic and on
the group, :mod:`halfmoon.server.rpc_permissions`). An empty answer long-polls
up to ``wait_ms`` (capped by ``long_polling_max``) on the same arrival
notifier as PullMessage.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb

from halfmoon.broker.facade import Broker, PullResult
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageView
from halfmoon.bulkread.format import METHOD, SERVICE, BulkAnswer, BulkRequest, FormatError
from halfmoon.config import ServerConfig
from halfmoon.errors import HalfmoonError
from halfmoon.server import namespace as ns
from halfmoon.server.errors import PROTOCOL_CODES, Code, RequestError, status_for
from halfmoon.server.handlers import RPCS
from halfmoon.server.longpoll import ArrivalNotifier
from halfmoon.server.rpc_common import Workers, metadata
from halfmoon.server.rpc_guard import RpcGuard

log = logging.getLogger("halfmoon.server.bulk")

RPC_NAME = "BulkRead"  # the name in metrics, ACL rules (rpc_permissions) and error texts
_DEADLINE_MARGIN = 0.3  # answer a long poll this long before the caller's deadline
# Only "nothing at this offset yet" is worth waiting for (as PullMessage).
_WAITABLE = frozenset({"NO_MESSAGE"})
_OUT_OF_RANGE = frozenset({"OFFSET_TOO_SMALL", "OFFSET_OVERFLOW"})
_CODE_NAMES = {number: name for name, number in PROTOCOL_CODES.items()}


def columns_of(views: list[MessageView]) -> dict[str, list[Any]]:
    """The answer's columns (:data:`halfmoon.bulkread.format.COLUMNS`) for ``views``."""
    bare: dict[str, str] = {}  # stored topic name -> the name without its namespace
    topics = []
    for view in views:
        name = bare.get(view.topic)
        if name is None:
            name = bare[view.topic] = ns.split(view.topic)[1]
        topics.append(name)
    return {
        "topic": topics,
        "queue_offset": [v.queue_offset for v in views],
        "message_id": [v.message_id for v in views],
        "tag": [v.tag for v in views],
        "keys": [v.keys for v in views],
        "properties": [v.properties for v in views],
        "body": [v.body for v in views],
        "born_timestamp": [v.born_timestamp for v in views],
        "store_timestamp": [v.store_timestamp for v in views],
        "born_host": [v.born_host for v in views],
        "message_type": [v.message_type.name for v in views],
        "message_group": [v.message_group for v in views],
        "delivery_timestamp": [v.delivery_timestamp for v in views],
        "transaction_id": [v.transaction_id for v in views],
    }


def answer_of(result: PullResult, queue_id: int) -> BulkAnswer:
    status = result.status.name
    if status in _OUT_OF_RANGE:
        code, text = (
            Code.ILLEGAL_OFFSET,
            (
                f"offset is outside the queue's range [{result.min_offset}, {result.max_offset}]; "
                f"continue from next_offset {result.next_offset}"
            ),
        )
    else:
        code, text = Code.OK, ""
    views = result.messages
    return BulkAnswer(
        code=code,
        status=status,
        message=text,
        queue_id=queue_id,
        next_offset=result.next_offset,
        min_offset=result.min_offset,
        max_offset=result.max_offset,
        count=len(views),
        columns=columns_of(views) if views else {},
    )


def error_answer(error: BaseException) -> BulkAnswer:
    wire = status_for(error, RPC_NAME)
    name = error.code if isinstance(error, HalfmoonError) else "INTERNAL_ERROR"
    return BulkAnswer(code=wire.code, status=name, message=wire.message)


class BulkReadService:
    """Serves ``/halfmoon.v1.BulkRead/Read`` with the broker, worker pool and notifier of
    the MessagingService servicer it sits beside."""

    def __init__(
        self,
        broker: Broker,
        config: ServerConfig,
        notifier: ArrivalNotifier,
        workers: Workers,
        guard: RpcGuard | None = None,
    ) -> None:
        self.broker = broker
        self.config = config
        self.notifier = notifier
        self.workers = workers
        self.guard = guard

    async def read(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            request = BulkRequest.decode(raw)
        except FormatError as exc:
            answer = BulkAnswer(code=Code.BAD_REQUEST, status="BAD_REQUEST", message=str(exc))
        else:
            denied = self.guard.check(RPC_NAME, request, context) if self.guard else None
            if denied is not None:
                answer = BulkAnswer(
                    code=denied.code,
                    status=_CODE_NAMES.get(denied.code, "FORBIDDEN"),
                    message=denied.message,
                )
            else:
                try:
                    return await self._serve(request, context)
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:  # noqa: BLE001 - every error becomes an answer
                    answer = error_answer(exc)
        _count(answer.code)
        return answer.encode()

    async def _serve(self, request: BulkRequest, context: grpc.aio.ServicerContext) -> bytes:
        header = metadata(context, ns.HEADER)
        topic = _stored(request.topic, request.namespace, header, "topic")
        group = _stored(request.group, request.namespace, header, "group")
        spec = FilterSpec(request.filter_kind, request.filter_expression)
        broker = self.broker
        queue_id = request.queue_id

        def read() -> tuple[PullResult, bytes]:
            # Read and encode on the worker thread: the loop only moves bytes.
            result = broker.bulk_read(
                group,
                topic,
                queue_id,
                request.offset,
                request.max_messages,
                request.max_bytes,
                spec,
                request.end_offset,
            )
            return result, answer_of(result, queue_id).encode()

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._budget(request, context)
        notifier = self.notifier
        while True:
            with notifier.waiter(topic) as waiter:
                result, encoded = await self.workers.call(read)
                remaining = deadline - loop.time()
                if (
                    result.messages
                    or remaining <= 0
                    or notifier.shutting_down
                    or result.status.name not in _WAITABLE
                ):
                    _count(Code.ILLEGAL_OFFSET if result.status.name in _OUT_OF_RANGE else Code.OK)
                    return encoded
                await waiter.wait(remaining)

    def _budget(self, request: BulkRequest, context: grpc.aio.ServicerContext) -> float:
        seconds = min(request.wait_ms / 1000, self.config.long_polling_max)
        remaining = context.time_remaining()
        if remaining is not None:
            seconds = min(seconds, remaining - _DEADLINE_MARGIN)
        return max(seconds, 0.0)


def _stored(name: str, namespace: str, header: str, kind: str) -> str:
    """The stored name (namespace applied, from the request or else the header)."""
    if not name:
        raise RequestError(f"{kind} is missing; name the {kind} to read")
    return ns.resolve(pb.Resource(name=name, resource_namespace=namespace), header, kind)


def _count(code: int) -> None:
    RPCS.inc(method=RPC_NAME, code=_CODE_NAMES.get(code) or str(code))


def bulk_read_handler(service: BulkReadService) -> grpc.GenericRpcHandler:
    """The generic handler for ``halfmoon.v1.BulkRead``: bytes in, bytes out (no protobuf)."""
    handler = grpc.unary_unary_rpc_method_handler(service.read)
    return grpc.method_handlers_generic_handler(SERVICE, {METHOD.rsplit("/", 1)[1]: handler})
