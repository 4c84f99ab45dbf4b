"""Consumption by pop over gRPC: the long-polled receive, and ack, change of
invisible time and forward to the dead-letter queue of what it handed out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.broker.facade import Broker
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageView
from halfmoon.config import ServerConfig
from halfmoon.errors import HalfmoonError
from halfmoon.server import convert, lite_subscriptions, txn_headers
from halfmoon.server.errors import Code, RequestError, ok, status, status_for
from halfmoon.server.longpoll import ArrivalNotifier
from halfmoon.server.renewal import Renewer
from halfmoon.server.rpc_common import (
    OK_STATUS,
    Workers,
    metadata,
    poll_budget,
    resource_name,
    unary,
    until_durable,
)
from halfmoon.server.telemetry import ClientRegistry

# A redelivery wake-up already in the past (the broker held the message back, e.g. FIFO):
# look again after this long rather than spinning.
_MIN_REPOLL = 0.05


class PopRpcs:
    """ReceiveMessage (a long poll on the arrival notifier), the ack, invisible-time change
    and dead-letter forward of what it handed out, and a lite consumer's subscriptions."""

    def __init__(
        self,
        broker: Broker,
        config: ServerConfig,
        registry: ClientRegistry,
        notifier: ArrivalNotifier,
        renewer: Renewer,
        workers: Workers,
    ) -> None:
        self.broker = broker
        self.config = config
        self.registry = registry
        self.notifier = notifier
        self.renewer = renewer
        self.workers = workers
        self.default_invisible_ms = broker.config.default_invisible_ms

    async def ReceiveMessage(
        self, request: svc.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[svc.ReceiveMessageResponse]:
        try:
            group = resource_name(request.group, "group", context)
            topic = resource_name(request.message_queue.topic, "message_queue.topic", context)
            if request.batch_size <= 0:
                raise RequestError(f"batch_size must be positive, got {request.batch_size}")
            batch = min(request.batch_size, self.config.max_receive_batch_size)
            invisible_ms = self.default_invisible_ms
            if request.HasField("invisible_duration"):
                # An explicit duration binds, even a zero one (which the broker rejects as
                # too short; 0 would otherwise mean "the default" to it).
                invisible_ms = max(convert.duration_ms(request.invisible_duration), 1)
            client_id = metadata(context, "x-mq-client-id")
            renew = bool(request.auto_renew and client_id and self.renewer.enabled)
            if renew:
                # As RocketMQ's proxy: the server picks the invisible time it then renews.
                invisible_ms = self.renewer.invisible_ms
            spec = convert.filter_spec(
                request.filter_expression if request.HasField("filter_expression") else None
            )
            budget = poll_budget(
                self.config,
                request.long_polling_timeout if request.HasField("long_polling_timeout") else None,
                context,
            )
            queue_id = self._assigned_queue(request.message_queue.id, client_id)
            views = await self._long_poll(
                group, topic, spec, batch, invisible_ms, client_id, budget, queue_id
            )
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001
            yield svc.ReceiveMessageResponse(status=status_for(exc, "ReceiveMessage"))
            return
        if not views:
            yield svc.ReceiveMessageResponse(
                status=status(Code.MESSAGE_NOT_FOUND, "no new message")
            )
            return
        yield svc.ReceiveMessageResponse(status=OK_STATUS)
        for view in views:
            yield svc.ReceiveMessageResponse(message=convert.wire_message(view))
        yield svc.ReceiveMessageResponse(
            delivery_timestamp=convert.to_timestamp(int(time.time() * 1000))
        )
        if renew:
            # Only once the client has them: an answer that never reached it (the call was
            # cancelled) is left to expire, not renewed for hours.
            self.renewer.track(client_id, group, topic, views)

    def _assigned_queue(self, queue_id: int, client_id: str) -> int | None:
        """The one queue a receive is limited to, or None for all of the topic's.

        Only a push consumer's receive names its queue on purpose: it receives per
        assignment, and a FIFO group's assignments are single queues. A simple
        consumer names whichever queue of the route it picked in turn and expects
        messages from any (RocketMQ's proxy pops broker-wide for it), so its queue
        id is not binding.
        """
        if queue_id < 0 or not client_id:
            return None
        session = self.registry.get(client_id)
        if session is None or session.client_type != pb.ClientType.PUSH_CONSUMER:
            return None
        return queue_id

    async def _long_poll(
        self,
        group: str,
        topic: str,
        spec: FilterSpec,
        batch: int,
        invisible_ms: int,
        client_id: str,
        budget: float,
        queue_id: int | None = None,
    ) -> list[MessageView]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        while True:
            with self.notifier.waiter(topic) as waiter:
                # On the loop when the broker can answer without blocking (the usual case,
                # an arrival waking this poll included): no thread hand-off between the
                # append and the answer. Else (Pending) on a worker thread.
                found = await self.workers.written(
                    self.broker.receive_nowait(
                        group, topic, spec, batch, invisible_ms, client_id, queue_id
                    )
                )
                views, wakeup_ms = found.result.views, found.result.next_wakeup_ms
                remaining = deadline - loop.time()
                if views or remaining <= 0 or self.notifier.shutting_down:
                    return views
                if wakeup_ms is not None:
                    until_redelivery = wakeup_ms / 1000 - time.time()
                    remaining = min(remaining, max(until_redelivery, _MIN_REPOLL))
                await waiter.wait(remaining)

    @unary(svc.AckMessageResponse)
    async def AckMessage(
        self, request: svc.AckMessageRequest, context: grpc.aio.ServicerContext
    ) -> svc.AckMessageResponse:
        group = resource_name(request.group, "group", context)
        topic = resource_name(request.topic, "topic", context)
        if not request.entries:
            raise RequestError(
                "AckMessage carries no entry; add the receipt handles to acknowledge"
            )
        client_id = metadata(context, "x-mq-client-id")
        # An auto-renewed message is acked with its original handle: use the current one.
        handles = [
            await self.renewer.current(client_id, group, e.receipt_handle) for e in request.entries
        ]

        lite_topics = [e.lite_topic if e.HasField("lite_topic") else None for e in request.entries]
        txn = txn_headers.transaction_group(context)  # halfmoon's client: ack on commit

        def ack_all() -> tuple[list[pb.Status], bool]:
            statuses = []
            for handle, lite_topic in zip(handles, lite_topics, strict=True):
                try:
                    if not handle:
                        raise RequestError("ack entry has no receipt_handle")
                    if txn is not None:
                        self.broker.transactional_ack(txn, group, topic, handle)
                    else:
                        self.broker.ack(group, topic, handle, lite_topic=lite_topic)
                    statuses.append(OK_STATUS)
                except Exception as exc:  # noqa: BLE001 - one bad handle does not fail the others
                    statuses.append(status_for(exc, "AckMessage"))
            lite = any(e.HasField("lite_topic") for e in request.entries)
            return statuses, lite or self._is_fifo(group)

        answered = await self._ack_on_loop(group, topic, handles, lite_topics, txn)
        if answered is not None:
            statuses, fifo = answered
        else:
            statuses, fifo = await self.workers.call(ack_all)
        if fifo:
            # In a FIFO group (and a lite topic) an ack releases the next message of its queue.
            self.notifier.wake(topic)
        results = [
            svc.AckMessageResultEntry(
                message_id=e.message_id, receipt_handle=e.receipt_handle, status=s
            )
            for e, s in zip(request.entries, statuses, strict=True)
        ]
        codes = {s.code for s in statuses}
        if codes == {Code.OK}:
            overall = OK_STATUS
        elif len(codes) == 1:
            overall = statuses[0]
        else:
            overall = status(Code.MULTIPLE_RESULTS, "some entries failed; see each entry's status")
        return svc.AckMessageResponse(status=overall, entries=results)

    async def _ack_on_loop(
        self,
        group: str,
        topic: str,
        handles: list[str],
        lite_topics: list[str | None],
        txn: str | None,
    ) -> tuple[list[pb.Status], bool] | None:
        """A batch of plain acks (no transaction, no lite topic) through ``ack_nowait``: on the
        loop when the broker can do it without blocking (bookkeeping in memory under one lock
        hold and one ack record appended), answered once that record is durable; on a worker
        thread when its answer is Pending. None: the caller acks each on a worker thread."""
        if txn is not None or not all(handles) or any(t is not None for t in lite_topics):
            return None
        config = self.broker.find_group(group)
        if config is None:
            return None
        written = await self.workers.written(self.broker.ack_nowait(group, topic, handles))
        results = written.result
        try:
            await until_durable(written.durable)
        except Exception as exc:  # noqa: BLE001 - every ack of the batch answers the failure
            results = [exc if error is None else error for error in results]
        statuses = [
            OK_STATUS if error is None else status_for(error, "AckMessage") for error in results
        ]
        return statuses, bool(config.fifo)

    def _is_fifo(self, group: str) -> bool:
        try:
            return bool(self.broker.get_group(group).fifo)
        except HalfmoonError:
            return False

    @unary(svc.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(
        self, request: svc.ChangeInvisibleDurationRequest, context: grpc.aio.ServicerContext
    ) -> svc.ChangeInvisibleDurationResponse:
        group = resource_name(request.group, "group", context)
        topic = resource_name(request.topic, "topic", context)
        if not request.receipt_handle:
            raise RequestError("receipt_handle is missing")
        current = await self.renewer.current(
            metadata(context, "x-mq-client-id"), group, request.receipt_handle
        )
        txn = txn_headers.transaction_group(context)
        if txn is not None:  # halfmoon's client: a reject applied on commit
            delay = convert.duration_ms(request.invisible_duration)
            await self.workers.call(
                self.broker.transactional_reject,
                txn,
                group,
                topic,
                current,
                None if txn_headers.wants_retry_backoff(context) else delay,
            )
            return svc.ChangeInvisibleDurationResponse(
                status=ok(), receipt_handle=request.receipt_handle
            )
        handle = await self.workers.call(
            self.broker.change_invisible_duration,
            group,
            topic,
            current,
            convert.duration_ms(request.invisible_duration),
            lite_topic=request.lite_topic if request.HasField("lite_topic") else None,
        )
        # Parked polls computed their wake-up from the old invisible time: let them look again.
        self.notifier.wake(topic)
        return svc.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=handle)

    @unary(svc.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(
        self, request: svc.ForwardMessageToDeadLetterQueueRequest, context: grpc.aio.ServicerContext
    ) -> svc.ForwardMessageToDeadLetterQueueResponse:
        group = resource_name(request.group, "group", context)
        topic = resource_name(request.topic, "topic", context)
        if not request.receipt_handle:
            raise RequestError("receipt_handle is missing")
        current = await self.renewer.current(
            metadata(context, "x-mq-client-id"), group, request.receipt_handle
        )
        txn = txn_headers.transaction_group(context)
        if txn is not None:  # halfmoon's client: dead-lettered on commit
            await self.workers.call(
                self.broker.transactional_reject, txn, group, topic, current, None, True
            )
            return svc.ForwardMessageToDeadLetterQueueResponse(status=ok())
        await self.workers.call(
            self.broker.forward_to_dead_letter,
            group,
            topic,
            current,
            lite_topic=request.lite_topic if request.HasField("lite_topic") else None,
        )
        self.notifier.wake(topic)  # a FIFO queue blocked behind this message moves on
        return svc.ForwardMessageToDeadLetterQueueResponse(status=ok())

    @unary(svc.SyncLiteSubscriptionResponse)
    async def SyncLiteSubscription(
        self, request: svc.SyncLiteSubscriptionRequest, context: grpc.aio.ServicerContext
    ) -> svc.SyncLiteSubscriptionResponse:
        call = lite_subscriptions.sync_call(
            request,
            metadata(context, "x-mq-client-id"),
            topic=resource_name(request.topic, "topic", context),
            group=resource_name(request.group, "group", context),
        )
        await self.workers.call(self.broker.sync_lite_subscription, *call)
        return svc.SyncLiteSubscriptionResponse(status=ok())
