"""The peer side of the internal protocol: one gRPC channel to one broker process.

Every call carries the version token and a deadline. Calls wait for the
channel to be ready (``wait_for_ready``) within their deadline, so a broker
restarting is waited for rather than failed at once; a request never sent is
never half done. What gRPC reports becomes a ``HalfmoonError``:

- DEADLINE_EXCEEDED → :class:`~halfmoon.cluster.wire.BrokerDeadlineExceeded`
  (the outcome is unknown: a send may have been stored);
- FAILED_PRECONDITION from the version check →
  :class:`~halfmoon.cluster.wire.WireVersionMismatch`;
- anything else (UNAVAILABLE, RESOURCE_EXHAUSTED, ...) →
  :class:`~halfmoon.cluster.wire.BrokerUnavailable`.

An error the broker raised on purpose comes back encoded in the answer and is
raised here as the same class.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import grpc

from halfmoon.broker.message import OutgoingMessage
from halfmoon.broker.produce import SendResult
from halfmoon.cluster import wire
from halfmoon.errors import HalfmoonError

DEFAULT_TIMEOUT_S = 10.0
EVENTS_DEADLINE_S = 300.0  # an event stream is reopened this often (and after any failure)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def _method(name: str) -> str:
    return f"/{wire.SERVICE}/{name}"


class BrokerConnection:
    """Calls to the broker process at ``target`` (``host:port``)."""

    def __init__(
        self,
        target: str,
        *,
        peer: str = "",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        version_token: str | None = None,
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.keepalive_time_ms", 10_000),
                ("grpc.keepalive_timeout_ms", 5_000),
                ("grpc.keepalive_permit_without_calls", 1),
                # A restarted broker is retried within a second, not after grpc's long backoff.
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1_000),
            ],
        )
        self.metadata: tuple[tuple[str, str], ...] = (
            (wire.VERSION_HEADER, version_token or wire.version_token()),
            ("hm-peer", peer),
        )
        self._hello = self._channel.unary_unary(_method("Hello"))
        self._call = self._channel.unary_unary(_method("Call"))
        self._send = self._channel.unary_unary(_method("Send"))
        self._advance_clock = self._channel.unary_unary(_method("AdvanceClock"))
        self._events = self._channel.stream_stream(_method("Events"))

    def close(self) -> None:
        self._channel.close()

    def hello(self, timeout_s: float | None = None) -> dict[str, Any]:
        """The version handshake: the broker's name and protocol version."""
        answer = self._unary(self._hello, wire.encode({}), timeout_s)
        if not isinstance(answer, dict):
            raise wire.MalformedRequest(f"the broker at {self.target} answered Hello oddly")
        return answer

    def call(
        self,
        operation: str,
        args: Sequence[object] = (),
        kwargs: dict[str, object] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """Run one facade operation in the broker; its result, or its error raised here."""
        request = wire.encode([operation, list(args), kwargs or {}])
        return self._unary(self._call, request, timeout_s)

    def send(
        self, batches: Sequence[Sequence[OutgoingMessage]], timeout_s: float | None = None
    ) -> list[list[SendResult] | HalfmoonError]:
        """Store many callers' batches in one request; per batch its results or its error."""
        answers = self._unary(self._send, wire.encode([list(b) for b in batches]), timeout_s)
        if not isinstance(answers, list) or len(answers) != len(batches):
            raise wire.MalformedRequest(f"the broker at {self.target} answered Send oddly")
        return answers

    def advance_clock(self, ms: int) -> int:
        """Move a broker's test clock (only a broker started with ``--fake-clock-ms`` has one)."""
        result = self._unary(self._advance_clock, wire.encode(ms), None)
        assert isinstance(result, int)
        return result

    def events(self, requests: Iterator[bytes]) -> Any:
        """Open the Events stream; an iterator of raw answers that can also be cancelled."""
        return self._events(
            requests, timeout=EVENTS_DEADLINE_S, metadata=self.metadata, wait_for_ready=True
        )

    def send_raw(self, method: str, request: bytes, timeout_s: float | None = None) -> bytes:
        """Any bytes to any method (tests of what the broker does with a bad request)."""
        stub = self._channel.unary_unary(_method(method))
        try:
            answer: bytes = stub(
                request, timeout=timeout_s or self.timeout_s, metadata=self.metadata
            )
        except grpc.RpcError as exc:
            raise rpc_error(exc, self.target) from None
        return answer

    def _unary(self, stub: Any, request: bytes, timeout_s: float | None) -> Any:
        try:
            raw = stub(
                request,
                timeout=timeout_s or self.timeout_s,
                metadata=self.metadata,
                wait_for_ready=True,
            )
        except grpc.RpcError as exc:
            raise rpc_error(exc, self.target) from None
        answer = wire.decode(raw)
        if isinstance(answer, HalfmoonError):
            raise answer
        return answer


def rpc_error(exc: grpc.RpcError, target: str) -> HalfmoonError:
    """What a failed gRPC call means to the caller, as a ``HalfmoonError``."""
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return wire.BrokerDeadlineExceeded(
            f"the broker at {target} did not answer in time; the outcome is unknown"
        )
    if code == grpc.StatusCode.FAILED_PRECONDITION and details.startswith(
        wire.WireVersionMismatch.code
    ):
        return wire.WireVersionMismatch(details.split(": ", 1)[-1])
    if code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(wire.MalformedRequest.code):
        return wire.MalformedRequest(details.split(": ", 1)[-1])
    name = code.name if code is not None else "UNKNOWN"
    return wire.BrokerUnavailable(f"the broker at {target} is unavailable ({name}: {details})")
