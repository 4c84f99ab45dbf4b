"""The ``apache.rocketmq.v2.MessagingService`` servicer (grpc.aio).

Each RPC translates its request into one broker call and the result back;
no business rule lives here. The broker is the :mod:`halfmoon.broker.facade`
protocol and nothing below it. Its calls are synchronous, so they run on a
small thread pool (``_call``) and the event loop stays free for the
thousands of parked long polls; the writes the facade says cannot block run
on the loop, and durability is awaited there too. Every failure becomes a
protocol ``Status`` (see :mod:`halfmoon.server.errors`); a handler never
raises into grpc, so no request can take the server down.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
from google.protobuf import duration_pb2
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from halfmoon.broker.facade import Broker, PullResult
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageView, OutgoingMessage
from halfmoon.broker.produce import SendResult
from halfmoon.config import ServerConfig
from halfmoon.errors import HalfmoonError
from halfmoon.server import client_settings, convert, lite_subscriptions, txn_headers
from halfmoon.server import namespace as ns
from halfmoon.server.errors import Code, RequestError, ok, status, status_for
from halfmoon.server.longpoll import ArrivalNotifier
from halfmoon.server.renewal import Renewer
from halfmoon.server.telemetry import ClientRegistry, ClientSession

log = logging.getLogger("halfmoon.server.grpc")

T = TypeVar("T")

_RESOLUTIONS = {
    pb.TransactionResolution.COMMIT: "commit",
    pb.TransactionResolution.ROLLBACK: "rollback",
}
_PERMISSION = {
    "rw": pb.Permission.READ_WRITE,
    "r": pb.Permission.READ,
    "w": pb.Permission.WRITE,
    "-": pb.Permission.NONE,
    "": pb.Permission.NONE,
}
# EndTransaction with this transaction id prefix ends a whole transaction group.
TRANSACTION_GROUP_PREFIX = "hm-group:"
# Answer a long poll this long before the client's deadline, so it gets an answer, not a timeout.
_DEADLINE_MARGIN = 0.3
# A redelivery wake-up already in the past (the broker held the message back, e.g. FIFO):
# look again after this long rather than spinning.
_MIN_REPOLL = 0.05
# Built once and copied into each answer: ``ok()`` resolves ``Code.OK`` through
# protobuf's Python-level enum wrapper, a visible cost per message on the send path.
_OK = ok()


def _metadata(context: grpc.aio.ServicerContext, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode("utf-8", "replace")
    return ""


def _peer_host(context: grpc.aio.ServicerContext) -> str:
    peer = context.peer() or ""
    # "ipv4:127.0.0.1:5555" / "ipv6:[::1]:5555"
    _, _, rest = peer.partition(":")
    return rest


def _unary(response_type: type) -> Callable:
    """Wrap a unary handler: any exception becomes ``response_type(status=...)``."""

    def decorate(handler: Callable) -> Callable:
        rpc = handler.__name__

        @functools.wraps(handler)
        async def wrapper(
            self: MessagingServicer, request: Any, context: grpc.aio.ServicerContext
        ) -> Any:
            try:
                return await handler(self, request, context)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - every error becomes a Status
                return response_type(status=status_for(exc, rpc))

        return wrapper

    return decorate


def _name(resource: pb.Resource, what: str, context: Any = None, header: str | None = None) -> str:
    """The stored name a request's topic or group Resource stands for (its namespace applied)."""
    if not resource.name:
        raise RequestError(f"{what} is missing; set {what}.name")
    if header is None:
        header = _metadata(context, ns.HEADER) if context is not None else ""
    return ns.resolve(resource, header, "group" if what.endswith("group") else "topic")


async def _until_durable(durable: Future[None]) -> None:
    """Wait for a write's promise to hold; no loop wake-up when it already does (async flush).

    Each waiter wraps the future itself. Sharing one wrapper per fsync
    (shielded per RPC) was measured: sequential sync-flush sends got ~100 ms
    p99 outliers that the plain wrap does not have.
    """
    if durable.done():
        durable.result()
        return
    await asyncio.wrap_future(durable)


class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):
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
        # Invisible-time renewal for push consumers (auto_renew receives): renewal.py.
        self.renewer = Renewer(broker, config, self._call, self._has_stream)

    def _has_stream(self, client_id: str) -> bool:
        session = self.registry.get(client_id)
        return session is not None and session.has_stream

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    # -- routes ----------------------------------------------------------------

    def _broker_pb(self, endpoints: pb.Endpoints | None) -> pb.Broker:
        if endpoints is None or not endpoints.addresses or len(endpoints.addresses) > 1:
            host, port = self.advertised
            scheme = pb.AddressScheme.IPv6 if ":" in host else pb.AddressScheme.IPv4
            if not host.replace(".", "").isdigit() and ":" not in host:
                scheme = pb.AddressScheme.DOMAIN_NAME
            endpoints = pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=port)])
        return pb.Broker(name=self.broker_name, id=0, endpoints=endpoints)

    @_unary(svc.QueryRouteResponse)
    async def QueryRoute(
        self, request: svc.QueryRouteRequest, context: grpc.aio.ServicerContext
    ) -> svc.QueryRouteResponse:
        topic = _name(request.topic, "topic", context)
        routes = await self._call(self.broker.route, topic)
        broker = self._broker_pb(request.endpoints if request.HasField("endpoints") else None)
        queues = []
        for route in routes:
            queues.append(
                pb.MessageQueue(
                    topic=request.topic,  # as the client named it (RocketMQ's proxy too)
                    id=route.queue_id,
                    permission=_PERMISSION.get(route.perm, pb.Permission.NONE),
                    broker=broker,
                    accept_message_types=sorted(
                        {convert.wire_type(t) for t in route.accepted_types}
                    ),
                )
            )
        return svc.QueryRouteResponse(status=ok(), message_queues=queues)

    @_unary(svc.QueryAssignmentResponse)
    async def QueryAssignment(
        self, request: svc.QueryAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> svc.QueryAssignmentResponse:
        topic = _name(request.topic, "topic", context)
        group = _name(request.group, "group", context)
        routes = await self._call(self.broker.route, topic)
        config = await self._call(self.broker.get_group, group)
        readable = [r for r in routes if "r" in r.perm]
        if not readable:
            return svc.QueryAssignmentResponse(
                status=status(Code.FORBIDDEN, f"topic {topic!r} has no readable queue")
            )
        resource = request.topic  # as the client named it (RocketMQ's proxy too)
        broker = self._broker_pb(request.endpoints if request.HasField("endpoints") else None)
        # As RocketMQ's proxy (RouteActivity.queryAssignment): a FIFO group gets every
        # readable queue, so a push consumer runs one receive loop per queue (see
        # ReceiveMessage); any other group one assignment, queue id -1, and the broker
        # balances its consumers over the queues itself (pop). Every consumer of the
        # group gets the same answer: a FIFO queue with an ordered message in flight
        # delivers nothing to anyone, which is what keeps the order.
        if config.fifo:
            queues = [
                pb.MessageQueue(
                    topic=resource,
                    id=r.queue_id,
                    permission=_PERMISSION.get(r.perm, pb.Permission.NONE),
                    broker=broker,
                )
                for r in readable
            ]
        else:
            queues = [
                pb.MessageQueue(
                    topic=resource, id=-1, permission=pb.Permission.READ_WRITE, broker=broker
                )
            ]
        return svc.QueryAssignmentResponse(
            status=ok(), assignments=[pb.Assignment(message_queue=q) for q in queues]
        )

    # -- clients -----------------------------------------------------------------

    @_unary(svc.HeartbeatResponse)
    async def Heartbeat(
        self, request: svc.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> svc.HeartbeatResponse:
        client_id = _metadata(context, "x-mq-client-id")
        group = _name(request.group, "group", context) if request.group.name else ""
        if group and request.client_type != pb.ClientType.PRODUCER:
            await self._call(
                self.broker.get_group, group
            )  # auto-creates, or says it does not exist
        if client_id:
            self.registry.touch(
                client_id,
                client_type=request.client_type,
                group=group or None,
                peer=_peer_host(context),
            )
        return svc.HeartbeatResponse(status=ok())

    @_unary(svc.NotifyClientTerminationResponse)
    async def NotifyClientTermination(
        self, request: svc.NotifyClientTerminationRequest, context: grpc.aio.ServicerContext
    ) -> svc.NotifyClientTerminationResponse:
        client_id = _metadata(context, "x-mq-client-id")
        if client_id:
            self.registry.remove(client_id)
            self.renewer.client_terminated(client_id)
            # A lite consumer's subscriptions end with it (a worker call: the broker's lock).
            await self._call(self.broker.client_terminated, client_id)
        return svc.NotifyClientTerminationResponse(status=ok())

    async def Telemetry(
        self,
        request_iterator: AsyncIterator[svc.TelemetryCommand],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[svc.TelemetryCommand]:
        client_id = _metadata(context, "x-mq-client-id")
        if not client_id:
            yield svc.TelemetryCommand(
                status=status(Code.CLIENT_ID_REQUIRED, "telemetry needs the x-mq-client-id header")
            )
            return
        session, outbox = self.registry.open_stream(client_id, _peer_host(context))
        header = _metadata(context, ns.HEADER)
        reader = asyncio.create_task(
            self._read_telemetry(request_iterator, session, outbox, header)
        )
        try:
            while True:
                command = await outbox.get()
                if command is None:
                    break
                yield command
        finally:
            reader.cancel()
            self.registry.close_stream(session, outbox)
            if not session.has_stream:  # not replaced by a newer stream of the client
                self.renewer.stream_closed(client_id)

    async def _read_telemetry(
        self,
        commands: AsyncIterator[svc.TelemetryCommand],
        session: ClientSession,
        outbox: asyncio.Queue,
        namespace: str = "",
    ) -> None:
        try:
            async for command in commands:
                if isinstance(command, str):  # a frame that did not decode (see handlers.py)
                    outbox.put_nowait(
                        svc.TelemetryCommand(status=status(Code.BAD_REQUEST, command))
                    )
                    continue
                kind = command.WhichOneof("command")
                if kind == "settings":
                    outbox.put_nowait(
                        await self._settings_answer(session, command.settings, namespace)
                    )
                elif kind in ("thread_stack_trace", "verify_message_result"):
                    log.info("event=telemetry_reply client_id=%s kind=%s", session.client_id, kind)
                session.last_seen = time.monotonic()
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError:
            pass
        except Exception as exc:  # noqa: BLE001 - a bad stream must not hurt the server
            log.warning("event=telemetry_read_failed client_id=%s error=%r", session.client_id, exc)
        # The client half-closed (or broke) its side: end ours too.
        outbox.put_nowait(None)

    async def _settings_answer(
        self, session: ClientSession, settings: pb.Settings, namespace: str = ""
    ) -> svc.TelemetryCommand:
        try:
            # The registry and the broker know stored names; the answer echoes the client's.
            stored = _stored_settings(settings, namespace)
            self.registry.apply_settings(session, stored)
            if settings.HasField("publishing"):
                answer = client_settings.producer_settings(
                    settings, self.config, self.max_body_size
                )
            elif settings.HasField("subscription"):
                group_name = stored.subscription.group.name
                if not group_name:
                    raise RequestError("subscription.group is missing; set subscription.group.name")
                group = await self._call(self.broker.get_group, group_name)
                client_settings.validate_subscriptions(settings)
                await self._call(self._subscribe, group_name, stored.subscription)
                answer = client_settings.consumer_settings(settings, group, self.config)
                lite_subscriptions.add_lite_settings(answer, settings, self.broker)
            else:
                answer = pb.Settings()
                answer.CopyFrom(settings)
            return svc.TelemetryCommand(status=ok(), settings=answer)
        except Exception as exc:  # noqa: BLE001
            return svc.TelemetryCommand(status=status_for(exc, "Telemetry"))

    def _subscribe(self, group: str, subscription: pb.Subscription) -> None:
        """Fix where a new group starts in each subscribed topic: when its consumer appears."""
        for entry in subscription.subscriptions:
            if not entry.topic.name:
                continue
            try:
                self.broker.subscribe(group, entry.topic.name)
            except HalfmoonError as exc:
                # An unknown topic is reported by the receive that names it; the client
                # still needs its settings answer to start.
                log.info(
                    "event=subscribe_skipped group=%s topic=%s code=%s",
                    group,
                    entry.topic.name,
                    exc.code,
                )

    # -- produce -------------------------------------------------------------------

    @_unary(svc.SendMessageResponse)
    async def SendMessage(
        self, request: svc.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> svc.SendMessageResponse:
        if not request.messages:
            raise RequestError("SendMessage carries no message; add at least one to messages")
        peer = _peer_host(context)
        client_id = _metadata(context, "x-mq-client-id")
        producer_group = self._producer_group(client_id)
        header = _metadata(context, ns.HEADER)
        outgoing = [
            convert.outgoing_message(m, peer, producer_group, namespace=header)
            for m in request.messages
        ]
        results = await self._send(outgoing)
        topics = {m.topic for m in outgoing}
        if client_id:
            for topic in topics:
                self.registry.note_topic(client_id, topic)
        # Every entry carries a transaction id, the message id for a plain send: RocketMQ's
        # broker answers every send so (SendMessageProcessor sets it from the message id).
        entries = [
            svc.SendResultEntry(
                status=_OK,
                message_id=r.message_id,
                transaction_id=r.transaction_id or r.message_id,
                offset=r.queue_offset,
                recall_handle=r.recall_handle or "",
            )
            for r in results
        ]
        return svc.SendMessageResponse(status=_OK, entries=entries)

    async def _send(self, outgoing: list[OutgoingMessage]) -> list[SendResult]:
        """``broker.send_nowait``, on the event loop when it cannot block, else on a worker
        thread; then wait, on the loop, until the answer's promise (durability) holds.

        A send of ordinary messages to a topic that exists validates, appends to
        the commit log's page-cache mapping and returns: tens of microseconds,
        less than the two thread hand-offs of a worker call. Half messages too:
        the transaction lock they take is held by a check scan one message at a
        time. The first send to a topic may create it (metadata written to
        disk) and a transaction group member may need a key-index lookup (is
        its group decided?): ``sends_cheaply`` says no and those run on the
        worker threads.
        """
        if self.broker.sends_cheaply(outgoing):
            written = self.broker.send_nowait(outgoing)
        else:
            written = await self._call(self.broker.send_nowait, outgoing)
        await _until_durable(written.durable)
        return written.result

    def _producer_group(self, client_id: str) -> str | None:
        """The producer group a client named in its heartbeats (halfmoon's client does)."""
        session = self.registry.get(client_id) if client_id else None
        if session is None or not session.is_producer:
            return None
        return session.group or None

    @_unary(svc.EndTransactionResponse)
    async def EndTransaction(
        self, request: svc.EndTransactionRequest, context: grpc.aio.ServicerContext
    ) -> svc.EndTransactionResponse:
        """Commit, roll back or leave (UNKNOWN) a transaction, or a whole transaction group.

        A decision is answered only once durable: the broker returns once its
        records are written (for a commit, the op record and the real message)
        with a future we await until they are durable. ``transaction_id``
        ``hm-group:<id>`` ends transaction group ``<id>`` (docs/transactions.md).
        """
        end = self.broker.end_transaction_nowait
        if not request.transaction_id:
            raise RequestError(
                # RocketMQ's EndTransactionActivity wording follows halfmoon's.
                "transaction_id is missing; use the one SendMessage returned. "
                "transaction id cannot be empty",
                code="INVALID_TRANSACTION_ID",
            )
        resolution = _RESOLUTIONS.get(request.resolution, "unknown")
        source = "check" if request.source == pb.TransactionSource.SOURCE_SERVER_CHECK else "client"
        if request.transaction_id.startswith(TRANSACTION_GROUP_PREFIX):
            group = request.transaction_id[len(TRANSACTION_GROUP_PREFIX) :]
            written = await self._call(
                self.broker.end_transaction_group_nowait,
                group,
                resolution,
                source,
                txn_headers.consume_actions(context),
            )
            await _until_durable(written.durable)
            return svc.EndTransactionResponse(status=ok())
        topic = _name(request.topic, "topic", context)
        if self.broker.transaction_ends_cheaply(request.transaction_id):
            # Pending or recently decided: an append (or nothing), like a plain send; no thread hop.
            result = end(topic, request.message_id, request.transaction_id, resolution, source)
        else:  # may look the decision up in the key index
            result = await self._call(
                end, topic, request.message_id, request.transaction_id, resolution, source
            )
        # The decision is acknowledged only once durable (it may publish the message).
        await _until_durable(result.durable)
        return svc.EndTransactionResponse(status=ok())

    @_unary(svc.RecallMessageResponse)
    async def RecallMessage(
        self, request: svc.RecallMessageRequest, context: grpc.aio.ServicerContext
    ) -> svc.RecallMessageResponse:
        message_id = await self._call(
            self.broker.recall, _name(request.topic, "topic", context), request.recall_handle
        )
        return svc.RecallMessageResponse(status=ok(), message_id=message_id)

    # -- consume by pop -------------------------------------------------------------

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

    def _receive_once(
        self,
        group: str,
        topic: str,
        spec: FilterSpec,
        batch: int,
        invisible_ms: int,
        client_id: str,
        queue_id: int | None = None,
    ) -> tuple[list[MessageView], int | None]:
        views = self.broker.receive(
            group, topic, spec, batch, invisible_ms, client_id, queue_id=queue_id
        )
        if views:
            return views, None
        return views, self.broker.next_wakeup_ms(group, topic, client_id)

    async def ReceiveMessage(
        self, request: svc.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[svc.ReceiveMessageResponse]:
        try:
            group = _name(request.group, "group", context)
            topic = _name(request.message_queue.topic, "message_queue.topic", context)
            if request.batch_size <= 0:
                raise RequestError(f"batch_size must be positive, got {request.batch_size}")
            batch = min(request.batch_size, self.config.max_receive_batch_size)
            invisible_ms = self.default_invisible_ms
            if request.HasField("invisible_duration"):
                # An explicit duration binds, even a zero one (which the broker rejects as
                # too short; 0 would otherwise mean "the default" to it).
                invisible_ms = max(convert.duration_ms(request.invisible_duration), 1)
            client_id = _metadata(context, "x-mq-client-id")
            renew = bool(request.auto_renew and client_id and self.renewer.enabled)
            if renew:
                # As RocketMQ's proxy: the server picks the invisible time it then renews.
                invisible_ms = self.renewer.invisible_ms
            spec = convert.filter_spec(
                request.filter_expression if request.HasField("filter_expression") else None
            )
            budget = self._poll_budget(
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
        yield svc.ReceiveMessageResponse(status=_OK)
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
                views, wakeup_ms = await self._call(
                    self._receive_once, group, topic, spec, batch, invisible_ms, client_id, queue_id
                )
                remaining = deadline - loop.time()
                if views or remaining <= 0 or self.notifier.shutting_down:
                    return views
                if wakeup_ms is not None:
                    until_redelivery = wakeup_ms / 1000 - time.time()
                    remaining = min(remaining, max(until_redelivery, _MIN_REPOLL))
                await waiter.wait(remaining)

    @_unary(svc.AckMessageResponse)
    async def AckMessage(
        self, request: svc.AckMessageRequest, context: grpc.aio.ServicerContext
    ) -> svc.AckMessageResponse:
        group = _name(request.group, "group", context)
        topic = _name(request.topic, "topic", context)
        if not request.entries:
            raise RequestError(
                "AckMessage carries no entry; add the receipt handles to acknowledge"
            )
        client_id = _metadata(context, "x-mq-client-id")
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
                    statuses.append(_OK)
                except Exception as exc:  # noqa: BLE001 - one bad handle does not fail the others
                    statuses.append(status_for(exc, "AckMessage"))
            lite = any(e.HasField("lite_topic") for e in request.entries)
            return statuses, lite or self._is_fifo(group)

        statuses, fifo = await self._call(ack_all)
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
            overall = _OK
        elif len(codes) == 1:
            overall = statuses[0]
        else:
            overall = status(Code.MULTIPLE_RESULTS, "some entries failed; see each entry's status")
        return svc.AckMessageResponse(status=overall, entries=results)

    def _is_fifo(self, group: str) -> bool:
        try:
            return bool(self.broker.get_group(group).fifo)
        except HalfmoonError:
            return False

    @_unary(svc.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(
        self, request: svc.ChangeInvisibleDurationRequest, context: grpc.aio.ServicerContext
    ) -> svc.ChangeInvisibleDurationResponse:
        group = _name(request.group, "group", context)
        topic = _name(request.topic, "topic", context)
        if not request.receipt_handle:
            raise RequestError("receipt_handle is missing")
        current = await self.renewer.current(
            _metadata(context, "x-mq-client-id"), group, request.receipt_handle
        )
        txn = txn_headers.transaction_group(context)
        if txn is not None:  # halfmoon's client: a reject applied on commit
            delay = convert.duration_ms(request.invisible_duration)
            await self._call(
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
        handle = await self._call(
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

    @_unary(svc.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(
        self, request: svc.ForwardMessageToDeadLetterQueueRequest, context: grpc.aio.ServicerContext
    ) -> svc.ForwardMessageToDeadLetterQueueResponse:
        group = _name(request.group, "group", context)
        topic = _name(request.topic, "topic", context)
        if not request.receipt_handle:
            raise RequestError("receipt_handle is missing")
        current = await self.renewer.current(
            _metadata(context, "x-mq-client-id"), group, request.receipt_handle
        )
        txn = txn_headers.transaction_group(context)
        if txn is not None:  # halfmoon's client: dead-lettered on commit
            await self._call(
                self.broker.transactional_reject, txn, group, topic, current, None, True
            )
            return svc.ForwardMessageToDeadLetterQueueResponse(status=ok())
        await self._call(
            self.broker.forward_to_dead_letter,
            group,
            topic,
            current,
            lite_topic=request.lite_topic if request.HasField("lite_topic") else None,
        )
        self.notifier.wake(topic)  # a FIFO queue blocked behind this message moves on
        return svc.ForwardMessageToDeadLetterQueueResponse(status=ok())

    # -- consume by pull (offsets) ---------------------------------------------------

    async def PullMessage(
        self, request: svc.PullMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[svc.PullMessageResponse]:
        try:
            group = _name(request.group, "group", context)
            topic = _name(request.message_queue.topic, "message_queue.topic", context)
            if request.batch_size <= 0:
                raise RequestError(f"batch_size must be positive, got {request.batch_size}")
            if request.offset < 0:
                raise RequestError(f"offset must be >= 0, got {request.offset}")
            batch = min(request.batch_size, self.config.max_receive_batch_size)
            spec = convert.filter_spec(
                request.filter_expression if request.HasField("filter_expression") else None
            )
            budget = self._poll_budget(
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
            yield svc.PullMessageResponse(status=_OK)
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
                result = await self._call(
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

    @_unary(svc.UpdateOffsetResponse)
    async def UpdateOffset(
        self, request: svc.UpdateOffsetRequest, context: grpc.aio.ServicerContext
    ) -> svc.UpdateOffsetResponse:
        group = _name(request.group, "group", context)
        topic = _name(request.message_queue.topic, "message_queue.topic", context)
        txn = txn_headers.transaction_group(context)
        if txn is not None:  # halfmoon's client: the offset moves on commit
            await self._call(
                self.broker.transactional_offset,
                txn,
                group,
                topic,
                request.message_queue.id,
                request.offset,
                txn_headers.expected_offset(context),
            )
            return svc.UpdateOffsetResponse(status=ok())
        await self._call(
            self.broker.update_offset, group, topic, request.message_queue.id, request.offset
        )
        return svc.UpdateOffsetResponse(status=ok())

    @_unary(svc.GetOffsetResponse)
    async def GetOffset(
        self, request: svc.GetOffsetRequest, context: grpc.aio.ServicerContext
    ) -> svc.GetOffsetResponse:
        group = _name(request.group, "group", context)
        topic = _name(request.message_queue.topic, "message_queue.topic", context)
        offset = await self._call(self.broker.get_offset, group, topic, request.message_queue.id)
        return svc.GetOffsetResponse(status=ok(), offset=offset)

    @_unary(svc.QueryOffsetResponse)
    async def QueryOffset(
        self, request: svc.QueryOffsetRequest, context: grpc.aio.ServicerContext
    ) -> svc.QueryOffsetResponse:
        topic = _name(request.message_queue.topic, "message_queue.topic", context)
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
        offset = await self._call(
            self.broker.query_offset, topic, request.message_queue.id, name, timestamp
        )
        return svc.QueryOffsetResponse(status=ok(), offset=offset)

    # -- lite topics (server/lite_subscriptions.py) ------------------------------------

    @_unary(svc.SyncLiteSubscriptionResponse)
    async def SyncLiteSubscription(
        self, request: svc.SyncLiteSubscriptionRequest, context: grpc.aio.ServicerContext
    ) -> svc.SyncLiteSubscriptionResponse:
        call = lite_subscriptions.sync_call(
            request,
            _metadata(context, "x-mq-client-id"),
            topic=_name(request.topic, "topic", context),
            group=_name(request.group, "group", context),
        )
        await self._call(self.broker.sync_lite_subscription, *call)
        return svc.SyncLiteSubscriptionResponse(status=ok())


def _stored_settings(settings: pb.Settings, header: str) -> pb.Settings:
    """A copy of a client's Settings with every topic and group as its stored name."""
    if not header and not _names_namespace(settings):
        return settings
    stored = pb.Settings()
    stored.CopyFrom(settings)
    resources: list[tuple[pb.Resource, str]] = []
    if stored.HasField("publishing"):
        resources.extend((r, "topic") for r in stored.publishing.topics)
    if stored.HasField("subscription"):
        resources.append((stored.subscription.group, "group"))
        resources.extend((e.topic, "topic") for e in stored.subscription.subscriptions)
    for resource, kind in resources:
        if resource.name:
            resource.name = ns.resolve(resource, header, kind)
            resource.resource_namespace = ""
    return stored


def _names_namespace(settings: pb.Settings) -> bool:
    if settings.HasField("publishing"):
        return any(r.resource_namespace for r in settings.publishing.topics)
    if settings.HasField("subscription"):
        sub = settings.subscription
        return bool(sub.group.resource_namespace) or any(
            e.topic.resource_namespace for e in sub.subscriptions
        )
    return False


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
