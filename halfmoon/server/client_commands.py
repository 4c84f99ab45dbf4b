"""Commands the server sends a connected client and whose reply it waits for.

RocketMQ 5 has the proxy ask a client over its telemetry stream and match the
reply by nonce: ``VerifyMessageCommand`` (mqadmin's ``queryMsgByUniqueKey -g
-d``, a.k.a. consumeMessageDirectly: "consume this message now, in your
listener, and tell me how it went") and ``PrintThreadStackTraceCommand``. The
reply is a ``TelemetryCommand`` carrying the same nonce and a ``Status``
(OK, FAILED_TO_CONSUME_MESSAGE, NOT_IMPLEMENTED, ...).

:class:`PendingReplies` holds one future per nonce on the server's event loop;
the telemetry reader resolves it, the admin API awaits it with a deadline.
A client that never answers (the official Python client 5.1.2 ignores
``VerifyMessageCommand``) times out with :class:`ClientDidNotAnswer`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from rocketmq.grpc_protocol import definition_pb2, service_pb2

from halfmoon.errors import HalfmoonError, NotFound

Code = definition_pb2.Code
# ClientRegistry.send_command: queue a command on a client's stream; False without a stream.
SendCommand = Callable[[str, service_pb2.TelemetryCommand], bool]


class ClientNotConnected(NotFound):
    code = "CLIENT_NOT_CONNECTED"
    protocol_code = "NOT_FOUND"


class ClientDidNotAnswer(HalfmoonError):
    """The client holds a stream but sent no reply in time (it may not implement the command)."""

    code = "CLIENT_DID_NOT_ANSWER"
    protocol_code = "PROXY_TIMEOUT"
    http_status = 500


@dataclass(frozen=True)
class ClientAnswer:
    client_id: str
    code: str  # the protocol Code's name: OK, FAILED_TO_CONSUME_MESSAGE, NOT_IMPLEMENTED, ...
    message: str

    @property
    def consumed(self) -> bool:
        return self.code == "OK"


class PendingReplies:
    """Futures of commands sent to clients, by nonce (used on the server's event loop only)."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[service_pb2.TelemetryCommand]] = {}

    def resolve(self, nonce: str, reply: service_pb2.TelemetryCommand) -> bool:
        """A reply arrived; False when nobody waits for its nonce (late, or unknown)."""
        future = self._waiting.pop(nonce, None)
        if future is None or future.done():
            return False
        future.set_result(reply)
        return True

    async def verify_message(
        self,
        send_command: SendCommand,
        client_id: str,
        message: definition_pb2.Message,
        timeout: float,
    ) -> ClientAnswer:
        """Ask ``client_id`` to consume ``message`` in its listener; its answer."""
        nonce = uuid.uuid4().hex
        command = service_pb2.TelemetryCommand(
            verify_message_command=service_pb2.VerifyMessageCommand(nonce=nonce, message=message)
        )
        future: asyncio.Future[service_pb2.TelemetryCommand] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiting[nonce] = future
        try:
            if not send_command(client_id, command):
                raise ClientNotConnected(
                    f"client {client_id!r} has no telemetry stream here: list the connected "
                    "consumers with 'halfmoon consumer status GROUP'"
                )
            try:
                reply = await asyncio.wait_for(future, timeout)
            except TimeoutError:
                raise ClientDidNotAnswer(
                    f"client {client_id!r} did not answer within {timeout:g} s; it may not "
                    "implement re-consumption (the official Python client ignores it)"
                ) from None
        finally:
            self._waiting.pop(nonce, None)
        code = reply.status.code if reply.HasField("status") else Code.OK
        name = Code.Name(code) if code in Code.values() else str(code)
        if name == "CODE_UNSPECIFIED":
            name = "OK"
        return ClientAnswer(client_id, name, reply.status.message)


def reply_nonce(command: service_pb2.TelemetryCommand) -> str | None:
    """The nonce of a client's reply to a command (None for anything else)."""
    kind = command.WhichOneof("command")
    if kind == "verify_message_result":
        return command.verify_message_result.nonce
    if kind == "thread_stack_trace":
        return command.thread_stack_trace.nonce
    if kind == "verify_message_command":  # the Node client echoes the command as its reply
        return command.verify_message_command.nonce
    return None
