"""The Telemetry stream: the client's settings up, the server's settings and commands down.

One bidirectional stream per endpoint. The client opens it by sending its
Settings (what it is: producer or consumer, its topics or subscriptions);
the server answers with the settings to use (retry policy, body-size limit,
the group's FIFO flag and backoff). After that the stream is the server's
only way to reach the client unprompted: ``RecoverOrphanedTransactionCommand``
asks a producer to resolve a transaction it left open, the print-stack and
verify-message commands ask for diagnostics.

A broken stream (server restart) is reopened with backoff and the settings
are sent again, so the server learns of the client again right away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.client.connection import Connection
from halfmoon.client.errors import ClientError, error_for_rpc_error, error_for_status

log = logging.getLogger("halfmoon.client.telemetry")

CommandHandler = Callable[[str, svc.TelemetryCommand], Awaitable[None] | None]


class TelemetrySession:
    """The telemetry stream to one endpoint, kept open until :meth:`close`."""

    def __init__(
        self,
        connection: Connection,
        settings: Callable[[], pb.Settings],
        on_settings: Callable[[pb.Settings], None],
        on_command: CommandHandler,
    ) -> None:
        self.connection = connection
        self._settings = settings
        self._on_settings = on_settings
        self._on_command = on_command
        self._outbox: asyncio.Queue[svc.TelemetryCommand | None] = asyncio.Queue()
        self._first_answer: asyncio.Future[pb.Settings] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._call: Any = None
        self.reconnects = 0
        self._last_error: ClientError | None = None

    async def start(self, timeout: float) -> pb.Settings:
        """Open the stream and wait for the server's settings answer (raises if it refuses)."""
        loop = asyncio.get_running_loop()
        self._first_answer = loop.create_future()
        self._task = asyncio.create_task(
            self._run(), name=f"halfmoon-telemetry-{self.connection.target}"
        )
        try:
            return await asyncio.wait_for(asyncio.shield(self._first_answer), timeout)
        except TimeoutError:
            if self._last_error is not None:
                raise self._last_error from None
            raise error_for_status(
                pb.Status(
                    code=pb.Code.REQUEST_TIMEOUT,
                    message=f"no settings answer from {self.connection.target} within {timeout}s",
                ),
                "Telemetry",
            ) from None

    def send(self, command: svc.TelemetryCommand) -> None:
        """Queue ``command`` for the server (settings updates, diagnostics replies)."""
        self._outbox.put_nowait(command)

    def resend_settings(self) -> None:
        """Announce changed settings (e.g. a new subscription)."""
        self.send(svc.TelemetryCommand(settings=self._settings()))

    async def _requests(
        self, outbox: asyncio.Queue[svc.TelemetryCommand | None]
    ) -> AsyncIterator[svc.TelemetryCommand]:
        while True:
            command = await outbox.get()
            if command is None:
                return
            yield command

    async def _run(self) -> None:
        attempt = 0
        while not self._closed:
            outbox = self._outbox
            outbox.put_nowait(svc.TelemetryCommand(settings=self._settings()))
            try:
                self._call = self.connection.telemetry(self._requests(outbox))
                async for command in self._call:
                    attempt = 0
                    await self._handle(command)
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                self._last_error = error_for_rpc_error(exc, "Telemetry", self.connection.target)
                log.info(
                    "event=telemetry_broken endpoint=%s code=%s", self.connection.target, exc.code()
                )
            except Exception as exc:  # noqa: BLE001 - the stream must come back
                self._fail_first(exc)
                log.warning(
                    "event=telemetry_failed endpoint=%s error=%r", self.connection.target, exc
                )
            # The call is over (the server ended it, or it broke): end its request
            # iterator too. gRPC does not cancel the task that drains the iterator
            # of a call that finished on its own, so without this the task waits on
            # the outbox forever and is destroyed pending at exit.
            outbox.put_nowait(None)
            if self._closed:
                return
            # A fresh outbox: the old request iterator belongs to the dead call.
            self._outbox = asyncio.Queue()
            attempt += 1
            self.reconnects += 1
            await asyncio.sleep(self.connection.config.reconnect_backoff.delay(attempt))

    def _fail_first(self, exc: BaseException) -> None:
        first = self._first_answer
        if (
            first is not None
            and not first.done()
            and not isinstance(exc, ClientError | grpc.aio.AioRpcError)
        ):
            first.set_exception(exc)

    async def _handle(self, command: svc.TelemetryCommand) -> None:
        kind = command.WhichOneof("command")
        first = self._first_answer
        if kind == "settings" or (kind is None and command.HasField("status")):
            if command.status.code not in (pb.Code.OK, pb.Code.CODE_UNSPECIFIED):
                error = error_for_status(command.status, "Telemetry")
                if first is not None and not first.done():
                    first.set_exception(error)
                else:
                    log.warning(
                        "event=settings_refused endpoint=%s error=%s", self.connection.target, error
                    )
                return
            if kind == "settings":
                self._on_settings(command.settings)
                if first is not None and not first.done():
                    first.set_result(command.settings)
            return
        if kind == "print_thread_stack_trace_command":
            self.send(
                svc.TelemetryCommand(
                    thread_stack_trace=svc.ThreadStackTrace(
                        nonce=command.print_thread_stack_trace_command.nonce,
                        thread_stack_trace=_stacks(),
                    )
                )
            )
            return
        if kind == "reconnect_endpoints_command":
            self._outbox.put_nowait(None)  # ends our half; _run reopens
            return
        try:
            result = self._on_command(self.connection.target, command)
            if asyncio.iscoroutine(result):
                await result
        except Exception as exc:  # noqa: BLE001 - one bad command must not end the stream
            log.warning("event=telemetry_command_failed kind=%s error=%r", kind, exc)

    async def close(self) -> None:
        """End the stream (half-close, then cancel)."""
        self._closed = True
        self._outbox.put_nowait(None)
        first = self._first_answer
        if first is not None and not first.done():
            first.cancel()
        if self._call is not None:
            self._call.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


def _stacks() -> str:
    lines = []
    for thread_id, frame in sys._current_frames().items():
        lines.append(f"Thread {thread_id}:\n" + "".join(traceback.format_stack(frame)))
    with contextlib.suppress(RuntimeError):
        for task in asyncio.all_tasks():
            lines.append(f"Task {task.get_name()}: {task!r}")
    return "\n".join(lines)
