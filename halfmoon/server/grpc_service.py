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

from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from halfmoon.broker.facade import Broker
from halfmoon.broker.message import OutgoingMessage
from halfmoon.broker.produce import SendResult
from halfmoon.broker.transactions import DecisionSource, EndRequest, Resolution
from halfmoon.config import ServerConfig
from halfmoon.server import convert, txn_headers
from halfmoon.server import namespace as ns
from halfmoon.server.client_rpc import ClientRpcs
from halfmoon.server.end_batching import EndBatcher
from halfmoon.server.errors import Code, RequestError, ok, status
from halfmoon.server.longpoll import ArrivalNotifier
from halfmoon.server.pop_rpc import PopRpcs
from halfmoon.server.pull_rpc import PullRpcs
from halfmoon.server.renewal import Renewer
from halfmoon.server.rpc_common import (
    OK_STATUS,
    Workers,
    metadata_pair,
    peer_host,
    resource_name,
    unary,
)
from halfmoon.server.telemetry import ClientRegistry

_RESOLUTIONS = {
    pb.TransactionResolution.COMMIT: Resolution.COMMIT,
    pb.TransactionResolution.ROLLBACK: Resolution.ROLLBACK,
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


class RouteRpcs:
    """QueryRoute and QueryAssignment: where a topic's queues are, and which of them a
    consumer of a group reads."""

    def __init__(self, broker: Broker, workers: Workers, *, advertised: tuple[str, int]) -> None:
        self.broker = broker
        self.workers = workers
        self.advertised = advertised
        self.broker_name = broker.config.name

    def _broker_pb(self, endpoints: pb.Endpoints | None, name: str = "") -> pb.Broker:
        """The broker a queue lives on, at the endpoints the client should call for it.

        ``name`` is set in cluster mode (the queue's broker): the client is sent back to
        the proxies it dialed, all of them, so it fails over between them; locally, to
        the one address it dialed, else to the advertised one."""
        if name and endpoints is not None and endpoints.addresses:
            return pb.Broker(name=name, id=0, endpoints=endpoints)
        if endpoints is None or not endpoints.addresses or len(endpoints.addresses) > 1:
            host, port = self.advertised
            scheme = pb.AddressScheme.IPv6 if ":" in host else pb.AddressScheme.IPv4
            if not host.replace(".", "").isdigit() and ":" not in host:
                scheme = pb.AddressScheme.DOMAIN_NAME
            endpoints = pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=port)])
        return pb.Broker(name=name or self.broker_name, id=0, endpoints=endpoints)

    @unary(svc.QueryRouteResponse)
    async def QueryRoute(
        self, request: svc.QueryRouteRequest, context: grpc.aio.ServicerContext
    ) -> svc.QueryRouteResponse:
        topic = resource_name(request.topic, "topic", context)
        routes = await self.workers.call(self.broker.route, topic)
        dialed = request.endpoints if request.HasField("endpoints") else None
        queues = []
        for route in routes:
            queues.append(
                pb.MessageQueue(
                    topic=request.topic,  # as the client named it (RocketMQ's proxy too)
                    id=route.queue_id,
                    permission=_PERMISSION.get(route.perm, pb.Permission.NONE),
                    broker=self._broker_pb(dialed, route.broker),
                    accept_message_types=sorted(
                        {convert.wire_type(t) for t in route.accepted_types}
                    ),
                )
            )
        return svc.QueryRouteResponse(status=ok(), message_queues=queues)

    @unary(svc.QueryAssignmentResponse)
    async def QueryAssignment(
        self, request: svc.QueryAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> svc.QueryAssignmentResponse:
        topic = resource_name(request.topic, "topic", context)
        group = resource_name(request.group, "group", context)
        routes = await self.workers.call(self.broker.route, topic)
        config = await self.workers.call(self.broker.get_group, group)
        readable = [r for r in routes if "r" in r.perm]
        if not readable:
            return svc.QueryAssignmentResponse(
                status=status(Code.FORBIDDEN, f"topic {topic!r} has no readable queue")
            )
        resource = request.topic  # as the client named it (RocketMQ's proxy too)
        dialed = request.endpoints if request.HasField("endpoints") else None
        broker = self._broker_pb(dialed, readable[0].broker)
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
                    broker=self._broker_pb(dialed, r.broker),
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


class SendRpcs:
    """SendMessage, EndTransaction and RecallMessage: the writes of producers."""

    def __init__(
        self,
        broker: Broker,
        registry: ClientRegistry,
        workers: Workers,
        ends: EndBatcher,
    ) -> None:
        self.broker = broker
        self.registry = registry
        self.workers = workers
        # EndTransactions of one loop turn decided with one append: end_batching.py.
        self.ends = ends

    @unary(svc.SendMessageResponse)
    async def SendMessage(
        self, request: svc.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> svc.SendMessageResponse:
        if not request.messages:
            raise RequestError("SendMessage carries no message; add at least one to messages")
        client_id, header = metadata_pair(context, "x-mq-client-id", ns.HEADER)
        producer_group = self._producer_group(client_id)
        outgoing = [
            convert.outgoing_message(m, "", producer_group, namespace=header)
            for m in request.messages
        ]
        if not all(m.born_host for m in outgoing):
            # The official clients name their host; asking grpc for the peer is a C call.
            peer = peer_host(context)
            for m in outgoing:
                m.born_host = m.born_host or peer
        results = await self._send(outgoing)
        if client_id:
            sent: dict[str, int] = {}
            for m in outgoing:
                sent[m.topic] = sent.get(m.topic, 0) + 1
            for topic, count in sent.items():
                self.registry.note_topic(client_id, topic, count)
        # Every entry carries a transaction id, the message id for a plain send: RocketMQ's
        # broker answers every send so (SendMessageProcessor sets it from the message id).
        # Added in place: building entries apart and passing the list copies each one again
        # (a quarter of the time per message of a large batch).
        response = svc.SendMessageResponse(status=OK_STATUS)
        add = response.entries.add
        for r in results:
            add(
                status=OK_STATUS,
                message_id=r.message_id,
                transaction_id=r.transaction_id or r.message_id,
                offset=r.queue_offset,
                recall_handle=r.recall_handle or "",
            )
        return response

    async def _send(self, outgoing: list[OutgoingMessage]) -> list[SendResult]:
        """``broker.send_nowait`` on the event loop, its answer awaited there: the results
        once durable (no loop wake-up when they already are).

        The broker never blocks the loop: a send that only appends (a topic that
        exists: tens of microseconds, less than two thread hand-offs) is written at
        once; what would block (a topic to create, a transaction group member's index
        lookup) it answers with a ``Pending`` that writes on a worker thread; a proxy's
        brokers a network hop away answer one that awaits their send stream on the
        loop, coalesced with other calls' sends.
        """
        return await self.broker.send_nowait(outgoing)

    def _producer_group(self, client_id: str) -> str | None:
        """The producer group a client named in its heartbeats (halfmoon's client does)."""
        session = self.registry.get(client_id) if client_id else None
        if session is None or not session.is_producer:
            return None
        return session.group or None

    @unary(svc.EndTransactionResponse)
    async def EndTransaction(
        self, request: svc.EndTransactionRequest, context: grpc.aio.ServicerContext
    ) -> svc.EndTransactionResponse:
        """Commit, roll back or leave (UNKNOWN) a transaction, or a whole transaction group.

        A decision is answered only once durable (for a commit, the real message; for a
        rollback, its op record). Those that arrive while an fsync runs share one append
        (:class:`EndBatcher`); the broker's answer says whether it was written at once or
        needs a worker thread (an index lookup, a network hop), the server does not choose.
        ``transaction_id`` ``hm-group:<id>`` ends transaction group ``<id>``
        (docs/transactions.md).
        """
        if not request.transaction_id:
            raise RequestError(
                # RocketMQ's EndTransactionActivity wording follows halfmoon's.
                "transaction_id is missing; use the one SendMessage returned. "
                "transaction id cannot be empty",
                code="INVALID_TRANSACTION_ID",
            )
        resolution = _RESOLUTIONS.get(request.resolution, Resolution.UNKNOWN)
        source = (
            DecisionSource.CHECK
            if request.source == pb.TransactionSource.SOURCE_SERVER_CHECK
            else DecisionSource.CLIENT
        )
        if request.transaction_id.startswith(TRANSACTION_GROUP_PREFIX):
            group = request.transaction_id[len(TRANSACTION_GROUP_PREFIX) :]
            await self.broker.end_transaction_group_nowait(
                group, resolution, source, txn_headers.consume_actions(context)
            )
        else:
            topic = resource_name(request.topic, "topic", context)
            await self.ends.end(
                EndRequest(request.transaction_id, resolution, source, request.message_id, topic)
            )
        return svc.EndTransactionResponse(status=ok())

    @unary(svc.RecallMessageResponse)
    async def RecallMessage(
        self, request: svc.RecallMessageRequest, context: grpc.aio.ServicerContext
    ) -> svc.RecallMessageResponse:
        message_id = await self.workers.call(
            self.broker.recall,
            resource_name(request.topic, "topic", context),
            request.recall_handle,
        )
        return svc.RecallMessageResponse(status=ok(), message_id=message_id)


class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):
    """Every RPC of the RocketMQ 5 ``MessagingService``, each handed to the group that
    serves it: routes, sends (here), client sessions (:mod:`~halfmoon.server.client_rpc`),
    pop and pull consumption (:mod:`~halfmoon.server.pop_rpc`,
    :mod:`~halfmoon.server.pull_rpc`). The groups share the broker facade, the client
    registry, the arrival notifier, the worker pool and the invisible-time renewer."""

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
        self.workers = Workers(
            executor or ThreadPoolExecutor(config.worker_threads, thread_name_prefix="halfmoon-rpc")
        )
        # Invisible-time renewal for push consumers (auto_renew receives): renewal.py.
        self.renewer = Renewer(broker, config, self.workers.call, self._has_stream)
        self.routes = RouteRpcs(broker, self.workers, advertised=advertised)
        self.sends = SendRpcs(
            broker, registry, self.workers, EndBatcher(broker.end_transactions_nowait)
        )
        self.clients = ClientRpcs(broker, config, registry, self.renewer, self.workers)
        self.pop = PopRpcs(broker, config, registry, notifier, self.renewer, self.workers)
        self.pull = PullRpcs(broker, config, notifier, self.workers)

    def _has_stream(self, client_id: str) -> bool:
        session = self.registry.get(client_id)
        return session is not None and session.has_stream

    # Each RPC returns its group's coroutine or stream as it is: no await of its own
    # between grpc and the handler.

    def QueryRoute(
        self, request: svc.QueryRouteRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[svc.QueryRouteResponse]:
        return self.routes.QueryRoute(request, context)

    def QueryAssignment(
        self, request: svc.QueryAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[svc.QueryAssignmentResponse]:
        return self.routes.QueryAssignment(request, context)

    def SendMessage(
        self, request: svc.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[svc.SendMessageResponse]:
        return self.sends.SendMessage(request, context)

    def EndTransaction(
        self, request: svc.EndTransactionRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[svc.EndTransactionResponse]:
        return self.sends.EndTransaction(request, context)

    def RecallMessage(
        self, request: svc.RecallMessageRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[svc.RecallMessageResponse]:
        return self.sends.RecallMessage(request, context)

    def Heartbeat(
        self, request: svc.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[svc.HeartbeatResponse]:
        return self.clients.Heartbeat(request, context)

    def NotifyClientTermination(
        self, request: svc.NotifyClientTerminationRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[svc.NotifyClientTerminationResponse]:
        return self.clients.NotifyClientTermination(request, context)

    def Telemetry(
        self,
        request_iterator: AsyncIterator[svc.TelemetryCommand],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[svc.TelemetryCommand]:
        return self.clients.Telemetry(request_iterator, context)

    def ReceiveMessage(
        self, request: svc.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[svc.ReceiveMessageResponse]:
        return self.pop.ReceiveMessage(request, context)

    def AckMessage(
        self, request: svc.AckMessageRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[svc.AckMessageResponse]:
        return self.pop.AckMessage(request, context)

    def ChangeInvisibleDuration(
        self, request: svc.ChangeInvisibleDurationRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[svc.ChangeInvisibleDurationResponse]:
        return self.pop.ChangeInvisibleDuration(request, context)

    def ForwardMessageToDeadLetterQueue(
        self, request: svc.ForwardMessageToDeadLetterQueueRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[svc.ForwardMessageToDeadLetterQueueResponse]:
        return self.pop.ForwardMessageToDeadLetterQueue(request, context)

    def SyncLiteSubscription(
        self, request: svc.SyncLiteSubscriptionRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[svc.SyncLiteSubscriptionResponse]:
        return self.pop.SyncLiteSubscription(request, context)

    def PullMessage(
        self, request: svc.PullMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[svc.PullMessageResponse]:
        return self.pull.PullMessage(request, context)

    def UpdateOffset(
        self, request: svc.UpdateOffsetRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[svc.UpdateOffsetResponse]:
        return self.pull.UpdateOffset(request, context)

    def GetOffset(
        self, request: svc.GetOffsetRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[svc.GetOffsetResponse]:
        return self.pull.GetOffset(request, context)

    def QueryOffset(
        self, request: svc.QueryOffsetRequest, context: grpc.aio.ServicerContext
    ) -> Awaitable[svc.QueryOffsetResponse]:
        return self.pull.QueryOffset(request, context)
