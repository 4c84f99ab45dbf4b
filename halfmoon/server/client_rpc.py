"""Client sessions over gRPC: heartbeats, termination, and the telemetry stream
that carries a client's settings and the server's answer to them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.broker.facade import Broker
from halfmoon.config import ServerConfig
from halfmoon.errors import HalfmoonError
from halfmoon.server import client_settings, lite_subscriptions
from halfmoon.server import namespace as ns
from halfmoon.server.client_commands import reply_nonce
from halfmoon.server.errors import Code, RequestError, ok, status, status_for
from halfmoon.server.renewal import Renewer
from halfmoon.server.rpc_common import Workers, metadata, peer_host, resource_name, unary
from halfmoon.server.rpc_guard import PUBLISH_FILTER
from halfmoon.server.telemetry import ClientRegistry, ClientSession

log = logging.getLogger("halfmoon.server.grpc")


class ClientRpcs:
    """Heartbeat, NotifyClientTermination and Telemetry: a client's session in the registry,
    and the settings it is answered on its telemetry stream."""

    def __init__(
        self,
        broker: Broker,
        config: ServerConfig,
        registry: ClientRegistry,
        renewer: Renewer,
        workers: Workers,
    ) -> None:
        self.broker = broker
        self.config = config
        self.registry = registry
        self.renewer = renewer
        self.workers = workers
        self.max_body_size = broker.config.max_body_size

    @unary(svc.HeartbeatResponse)
    async def Heartbeat(
        self, request: svc.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> svc.HeartbeatResponse:
        client_id = metadata(context, "x-mq-client-id")
        group = resource_name(request.group, "group", context) if request.group.name else ""
        if group and request.client_type != pb.ClientType.PRODUCER:
            await self.workers.call(
                self.broker.get_group, group
            )  # auto-creates, or says it does not exist
        if client_id:
            self.registry.touch(
                client_id,
                client_type=request.client_type,
                group=group or None,
                peer=peer_host(context),
            )
        return svc.HeartbeatResponse(status=ok())

    @unary(svc.NotifyClientTerminationResponse)
    async def NotifyClientTermination(
        self, request: svc.NotifyClientTerminationRequest, context: grpc.aio.ServicerContext
    ) -> svc.NotifyClientTerminationResponse:
        client_id = metadata(context, "x-mq-client-id")
        if client_id:
            self.registry.remove(client_id)
            self.renewer.client_terminated(client_id)
            # A lite consumer's subscriptions end with it (a worker call: the broker's lock).
            await self.workers.call(self.broker.client_terminated, client_id)
        return svc.NotifyClientTerminationResponse(status=ok())

    async def Telemetry(
        self,
        request_iterator: AsyncIterator[svc.TelemetryCommand],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[svc.TelemetryCommand]:
        client_id = metadata(context, "x-mq-client-id")
        if not client_id:
            yield svc.TelemetryCommand(
                status=status(Code.CLIENT_ID_REQUIRED, "telemetry needs the x-mq-client-id header")
            )
            return
        session, outbox = self.registry.open_stream(client_id, peer_host(context))
        session.may_publish = PUBLISH_FILTER.get()  # set by the edge check (rpc_guard)
        header = metadata(context, ns.HEADER)
        reader = asyncio.create_task(
            self._read_telemetry(request_iterator, session, outbox, header)
        )
        try:
            while True:
                command = outbox.get_nowait() if outbox.qsize() else await outbox.get()
                if command is None:
                    break
                yield command  # a burst of checks goes out without a queue wait each
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
                elif kind in (
                    "thread_stack_trace",
                    "verify_message_result",
                    "verify_message_command",
                ):
                    nonce = reply_nonce(command)
                    waited = nonce is not None and self.registry.replies.resolve(nonce, command)
                    log.info(
                        "event=telemetry_reply client_id=%s kind=%s awaited=%s",
                        session.client_id,
                        kind,
                        waited,
                    )
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
                group = await self.workers.call(self.broker.get_group, group_name)
                client_settings.validate_subscriptions(settings)
                await self.workers.call(self._subscribe, group_name, stored.subscription)
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
