"""Consumption by pull over gRPC: long-polled reads at an offset, and the
offsets a pull consumer stores and queries."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.broker.facade import Broker, PullResult
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.config import ServerConfig
from halfmoon.server import convert, txn_headers
from halfmoon.server.errors import Code, RequestError, ok, status, status_for
from halfmoon.server.longpoll import ArrivalNotifier
from halfmoon.server.rpc_common import OK_STATUS, Workers, poll_budget, resource_name, unary


class PullRpcs:
    """PullMessage (a long poll at an offset) and the offsets a pull consumer stores and
    queries."""

    def __init__(
        self,
        broker: Broker,
        config: ServerConfig,
        notifier: ArrivalNotifier,
        workers: Workers,
    ) -> None:
        self.broker = broker
        self.config = config
        self.notifier = notifier
        self.workers = workers

    async def PullMessage(
        self, request: svc.PullMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[svc.PullMessageResponse]:
        try:
            group = resource_name(request.group, "group", context)
            topic = resource_name(request.message_queue.topic, "message_queue.topic", context)
            if request.batch_size <= 0:
                raise RequestError(f"batch_size must be positive, got {request.batch_size}")
            if request.offset < 0:
                raise RequestError(f"offset must be >= 0, got {request.offset}")
            batch = min(request.batch_size, self.config.max_receive_batch_size)
            spec = convert.filter_spec(
                request.filter_expression if request.HasField("filter_expression") else None
            )
            budget = poll_budget(
                self.config,
                request.long_polling_timeout if request.HasField("long_polling_timeout") else None,
                context,
            )
            result = await self._pull_poll(
                group, topic, request.message_queue.id, request.offset, batch, spec, budget
            )
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001
            yield svc.PullMessageResponse(status=status_for(exc, "PullMessage"))
            return
        messages = list(result.messages)
        if messages:
            yield svc.PullMessageResponse(status=OK_STATUS)
            for view in messages:
                yield svc.PullMessageResponse(message=convert.wire_message(view))
        else:
            code, text = _pull_status(result)
            yield svc.PullMessageResponse(status=status(code, text))
        yield svc.PullMessageResponse(next_offset=result.next_offset)

    async def _pull_poll(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        batch: int,
        spec: FilterSpec,
        budget: float,
    ) -> PullResult:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        while True:
            with self.notifier.waiter(topic) as waiter:
                result = await self.workers.call(
                    self.broker.pull, group, topic, queue_id, offset, batch, spec
                )
                remaining = deadline - loop.time()
                if (
                    result.messages
                    or remaining <= 0
                    or self.notifier.shutting_down
                    or _status_name(result) not in _WAITABLE
                ):
                    return result
                await waiter.wait(remaining)

    @unary(svc.UpdateOffsetResponse)
    async def UpdateOffset(
        self, request: svc.UpdateOffsetRequest, context: grpc.aio.ServicerContext
    ) -> svc.UpdateOffsetResponse:
        group = resource_name(request.group, "group", context)
        topic = resource_name(request.message_queue.topic, "message_queue.topic", context)
        txn = txn_headers.transaction_group(context)
        if txn is not None:  # halfmoon's client: the offset moves on commit
            await self.workers.call(
                self.broker.transactional_offset,
                txn,
                group,
                topic,
                request.message_queue.id,
                request.offset,
                txn_headers.expected_offset(context),
            )
            return svc.UpdateOffsetResponse(status=ok())
        await self.workers.call(
            self.broker.update_offset, group, topic, request.message_queue.id, request.offset
        )
        return svc.UpdateOffsetResponse(status=ok())

    @unary(svc.GetOffsetResponse)
    async def GetOffset(
        self, request: svc.GetOffsetRequest, context: grpc.aio.ServicerContext
    ) -> svc.GetOffsetResponse:
        group = resource_name(request.group, "group", context)
        topic = resource_name(request.message_queue.topic, "message_queue.topic", context)
        offset = await self.workers.call(
            self.broker.get_offset, group, topic, request.message_queue.id
        )
        return svc.GetOffsetResponse(status=ok(), offset=offset)

    @unary(svc.QueryOffsetResponse)
    async def QueryOffset(
        self, request: svc.QueryOffsetRequest, context: grpc.aio.ServicerContext
    ) -> svc.QueryOffsetResponse:
        topic = resource_name(request.message_queue.topic, "message_queue.topic", context)
        policy = request.query_offset_policy
        timestamp = None
        if policy == pb.QueryOffsetPolicy.BEGINNING:
            name = "beginning"
        elif policy == pb.QueryOffsetPolicy.END:
            name = "end"
        elif policy == pb.QueryOffsetPolicy.TIMESTAMP:
            if not request.HasField("timestamp"):
                raise RequestError("query_offset_policy TIMESTAMP needs a timestamp")
            name, timestamp = "timestamp", convert.timestamp_ms(request.timestamp)
        else:
            raise RequestError(
                f"unknown query_offset_policy {policy}; use BEGINNING, END or TIMESTAMP"
            )
        offset = await self.workers.call(
            self.broker.query_offset, topic, request.message_queue.id, name, timestamp
        )
        return svc.QueryOffsetResponse(status=ok(), offset=offset)


# Only "nothing at this offset yet" is worth waiting for; filtered-out entries and bad
# offsets are answered at once so the client moves to next_offset.
_WAITABLE = {"NO_MESSAGE", "FOUND"}


def _status_name(result: PullResult) -> str:
    return result.status.name


def _pull_status(result: PullResult) -> tuple[int, str]:
    name = _status_name(result)
    if name in (
        "OFFSET_TOO_SMALL",
        "OFFSET_OVERFLOW",
        "OFFSET_FOUND_NULL",
        "OFFSET_OVERFLOW_BADLY",
    ):
        return Code.ILLEGAL_OFFSET, (
            f"offset is outside the queue's range [{result.min_offset}, "
            f"{result.max_offset}]; continue from next_offset {result.next_offset}"
        )
    if name == "NO_SUCH_QUEUE":
        return Code.NOT_FOUND, "no such queue"
    return Code.MESSAGE_NOT_FOUND, "no new message"
