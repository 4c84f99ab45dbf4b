"""What every producer and consumer shares: start, heartbeats, route refresh, clean shutdown.

Lifecycle: ``start()`` opens the telemetry stream to the access point and
waits for the server's settings (a refused subscription fails here, with its
typed error); a background task then heartbeats every endpoint the client
talks to (every 10 s by default) and refreshes cached routes (every 30 s).
``close()`` stops the background work, tells each endpoint goodbye
(``NotifyClientTermination``), ends the telemetry streams and closes the
channels. Clients are async context managers, so ``async with`` does both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
import socket
from typing import Any, Self

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.client.connection import CLIENT_VERSION, ClientConfig, ConnectionPool, endpoints_pb
from halfmoon.client.errors import ClientClosed, ClientError
from halfmoon.client.route import RouteCache
from halfmoon.client.telemetry import TelemetrySession

log = logging.getLogger("halfmoon.client")


def as_config(config: ClientConfig | str, **overrides: Any) -> ClientConfig:
    if isinstance(config, str):
        return ClientConfig(endpoints=config, **overrides)
    if overrides:
        raise TypeError(
            "pass options either in a ClientConfig or as keywords with an endpoints string, not "
            "both"
        )
    return config


class BaseClient:
    """Shared machinery; use :class:`Producer` or one of the consumers."""

    client_type: int = pb.ClientType.CLIENT_TYPE_UNSPECIFIED

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.client_id = config.client_id
        self._pool = ConnectionPool(config)
        self.routes = RouteCache(self._pool, config.namespace, on_endpoint=self._on_new_endpoint)
        self._telemetry: dict[str, TelemetrySession] = {}
        self._background: list[asyncio.Task[Any]] = []
        self._started = False
        self._closed = False
        self.server_settings: pb.Settings | None = None

    # -- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Connect: open telemetry, receive the server's settings, start heartbeats."""
        if self._closed:
            raise ClientClosed(f"{type(self).__name__} is closed; create a new one")
        if self._started:
            return
        self._started = True
        try:
            session = self._open_telemetry(self._pool.access_point.target)
            await session.start(max(self.config.request_timeout, 1.0))
            await self._heartbeat_once()
            await self._on_started()
        except BaseException:
            await self.close()
            raise
        self._background.append(
            asyncio.create_task(self._maintenance(), name=f"halfmoon-maintenance-{self.client_id}")
        )

    async def _on_started(self) -> None:
        """Subclass hook after settings arrived (e.g. start consuming)."""

    async def close(self) -> None:
        """Stop background work, say goodbye to every endpoint, close the channels. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._on_closing()
        for task in self._background:
            task.cancel()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._background.clear()
        if self._started:
            group = self._group_resource()
            request = (
                svc.NotifyClientTerminationRequest(group=group)
                if group is not None
                else svc.NotifyClientTerminationRequest()
            )
            await asyncio.gather(
                *(
                    c.call("NotifyClientTermination", request, timeout=1.0)
                    for c in self._pool.all()
                ),
                return_exceptions=True,
            )
        await asyncio.gather(*(s.close() for s in self._telemetry.values()), return_exceptions=True)
        self._telemetry.clear()
        await self._pool.close()

    async def _on_closing(self) -> None:
        """Subclass hook before shutdown (drain in-flight work)."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed(f"{type(self).__name__} is closed; create a new one")
        if not self._started:
            raise ClientClosed(
                f"{type(self).__name__} is not started; call start() or use 'async with'"
            )

    @property
    def closed(self) -> bool:
        return self._closed

    # -- settings and telemetry --------------------------------------------------------

    def _settings(self) -> pb.Settings:
        """The Settings this client announces (subclasses add publishing / subscription)."""
        settings = pb.Settings(
            client_type=self.client_type,
            access_point=endpoints_pb(self._pool.access_point.target),
            user_agent=pb.UA(
                language=pb.Language.PYTHON,
                version=CLIENT_VERSION,
                platform=platform.platform(),
                hostname=socket.gethostname(),
            ),
        )
        settings.request_timeout.FromMilliseconds(int(self.config.request_timeout * 1000))
        return settings

    def _apply_settings(self, settings: pb.Settings) -> None:
        """The server's settings answer (subclasses read their part)."""
        self.server_settings = settings

    async def _on_command(self, endpoint: str, command: svc.TelemetryCommand) -> None:
        """A server command on the telemetry stream (subclasses handle theirs)."""
        if command.WhichOneof("command") == "verify_message_command":
            # Re-consumption is a push consumer's (it has a listener); others say so, as
            # RocketMQ's clients do, rather than leave the server waiting.
            self._answer_verify(
                endpoint,
                command.verify_message_command.nonce,
                pb.Code.NOT_IMPLEMENTED,
                f"a {type(self).__name__} has no listener to consume the message with",
            )
            return
        log.info(
            "event=telemetry_command_ignored endpoint=%s kind=%s",
            endpoint,
            command.WhichOneof("command"),
        )

    def _answer_verify(self, endpoint: str, nonce: str, code: int, message: str) -> None:
        """Reply to a VerifyMessageCommand (consumeMessageDirectly) on ``endpoint``'s stream."""
        session = self._telemetry.get(endpoint)
        if session is not None:
            session.send(
                svc.TelemetryCommand(
                    status=pb.Status(code=code, message=message),
                    verify_message_result=svc.VerifyMessageResult(nonce=nonce),
                )
            )

    def _open_telemetry(self, endpoint: str) -> TelemetrySession:
        session = self._telemetry.get(endpoint)
        if session is None:
            session = TelemetrySession(
                self._pool.get(endpoint), self._settings, self._apply_settings, self._on_command
            )
            self._telemetry[endpoint] = session
        return session

    def _on_new_endpoint(self, endpoint: str) -> None:
        if self._closed or endpoint in self._telemetry:
            return
        session = self._open_telemetry(endpoint)
        task = asyncio.create_task(self._start_quietly(session))
        self._background.append(task)

    async def _start_quietly(self, session: TelemetrySession) -> None:
        with contextlib.suppress(ClientError, asyncio.CancelledError):
            await session.start(self.config.request_timeout)

    def _resend_settings(self) -> None:
        for session in self._telemetry.values():
            session.resend_settings()

    # -- heartbeats and routes ----------------------------------------------------------

    def _group_resource(self) -> pb.Resource | None:
        """The group this client heartbeats for (consumers; producers have none)."""
        return None

    async def _heartbeat_once(self) -> None:
        group = self._group_resource()
        request = svc.HeartbeatRequest(client_type=self.client_type)
        if group is not None:
            request.group.CopyFrom(group)
        connections = self._pool.all() or [self._pool.access_point]
        results = await asyncio.gather(
            *(c.call("Heartbeat", request) for c in connections), return_exceptions=True
        )
        for connection, result in zip(connections, results, strict=True):
            if isinstance(result, BaseException):
                log.info("event=heartbeat_failed endpoint=%s error=%r", connection.target, result)
            elif result.status.code != pb.Code.OK:
                log.warning(
                    "event=heartbeat_refused endpoint=%s code=%s message=%s",
                    connection.target,
                    result.status.code,
                    result.status.message,
                )

    async def _maintenance(self) -> None:
        loop = asyncio.get_running_loop()
        next_routes = loop.time() + self.config.route_refresh_interval
        while True:
            await asyncio.sleep(self.config.heartbeat_interval)
            try:
                await self._heartbeat_once()
                if loop.time() >= next_routes:
                    next_routes = loop.time() + self.config.route_refresh_interval
                    await self.routes.refresh_all()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - maintenance keeps going
                log.warning("event=maintenance_failed error=%r", exc)
