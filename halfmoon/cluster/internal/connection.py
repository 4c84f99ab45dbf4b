"""The peer side of the internal protocol: one gRPC channel to one broker process.

Every call carries the version token and a deadline. A call to a broker that
cannot be reached (connection refused, reset, the channel backing off after
a failure) waits at most :data:`READY_WAIT_S` for the channel to come back
(a broker restarting), then fails with ``BROKER_UNAVAILABLE`` rather than
waiting out its deadline; within a second of such a failure the next calls
fail at once. A proxy then answers its client quickly with a code the client
retries, and steers other sends away from the broker
(:attr:`BrokerConnection.failed_at` marks it suspect). A call that misses its deadline
(a partition that drops packets, no reset) marks it suspect too. A send's
deadline (on the send listener's connection,
:mod:`halfmoon.cluster.internal.send.stream`) is at most :data:`SEND_TIMEOUT_S`, and
keepalive pings find a silent transport within 7 s. What gRPC reports becomes a
``HalfmoonError``:

- DEADLINE_EXCEEDED → :class:`~halfmoon.cluster.internal.wire.BrokerDeadlineExceeded`
  (the outcome is unknown: a send may have been stored);
- FAILED_PRECONDITION from the version check →
  :class:`~halfmoon.cluster.internal.wire.WireVersionMismatch`;
- anything else (UNAVAILABLE, RESOURCE_EXHAUSTED, ...) →
  :class:`~halfmoon.cluster.internal.wire.BrokerUnavailable`.

An error the broker raised on purpose comes back encoded in the answer and is
raised here as the same class.

A connection to a member of a broker group is made for one epoch of the group
(``epoch``): every call's metadata names it, and the broker refuses calls
meant for another epoch than its own (:mod:`halfmoon.cluster.internal.fencing`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import grpc.aio

from halfmoon.cluster.internal import fencing, wire
from halfmoon.cluster.internal.internal_tls import PLAINTEXT, InternalTls
from halfmoon.errors import HalfmoonError

DEFAULT_TIMEOUT_S = 10.0
# A send's deadline: a broker cut off without a reset (packets dropped) is reported to the
# client within it, with a code it retries, instead of after the call's full deadline.
SEND_TIMEOUT_S = 5.0
# A call that finds the broker unreachable waits this long for the channel to reconnect (a
# restart) before failing; within SUSPECT_WINDOW_S of such a failure, it fails at once. The
# channel's next attempt can be up to 1.2 s away (max_reconnect_backoff_ms below, plus
# grpc's 20 % jitter): a shorter wait would fail the first call after a restart.
READY_WAIT_S = 2.0
SUSPECT_WINDOW_S = 1.0
EVENTS_DEADLINE_S = 300.0  # an event stream is reopened this often (and after any failure)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def channel_options() -> list[tuple[str, int]]:
    """The options of every channel to a broker (the blocking one and a proxy's send stream)."""
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # A transport whose packets are dropped (a partition, no reset) is found dead within
        # 7 s and its calls fail; the broker permits a ping every 5 s (broker_node.py).
        ("grpc.keepalive_time_ms", 5_000),
        ("grpc.keepalive_timeout_ms", 2_000),
        ("grpc.keepalive_permit_without_calls", 1),
        # A restarted broker is retried within a second, not after grpc's long backoff.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1_000),
    ]


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
        epoch: int | None = None,
        tls: InternalTls = PLAINTEXT,
    ) -> None:
        self.target = target
        self.tls = tls
        self.epoch = epoch  # the group epoch every call is meant for (fencing.py); None: none
        self.timeout_s = timeout_s
        # When a call last found the broker unreachable (monotonic), None once one succeeded.
        self.failed_at: float | None = None
        # Plaintext, or mutual TLS when the process has [internal] set (internal_tls.py).
        self._channel = tls.channel(target, channel_options())
        # Whether the transport carried the last call there and back (no failure since): a
        # call that fails while it did may have reached the broker, and is not retried (a
        # send would be stored twice). Known from calls, not from grpc's connectivity watch,
        # whose polling thread outlives an unsubscribe and raises when the channel closes.
        self._connected = False
        self._closed = False
        self.metadata: tuple[tuple[str, str], ...] = (
            (wire.VERSION_HEADER, version_token or wire.version_token()),
            ("hm-peer", peer),
        )
        if epoch is not None:
            self.metadata += ((fencing.EPOCH_HEADER, fencing.header_value(epoch)),)
        self._hello = self._channel.unary_unary(_method("Hello"))
        self._call = self._channel.unary_unary(_method("Call"))
        self._advance_clock = self._channel.unary_unary(_method("AdvanceClock"))
        self._events = self._channel.stream_stream(_method("Events"))

    def close(self) -> None:
        self._closed = True
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
        timeout = timeout_s or self.timeout_s
        was_connected = self._connected
        try:
            raw = self._once(stub, request, timeout)
        except wire.BrokerUnavailable as exc:
            # Not ready (a broker restarting: the channel backs off up to 1.2 s). Unless
            # it was found unreachable a moment ago, give it READY_WAIT_S to come back. A call
            # made on a connected channel is not repeated: the connection may have dropped
            # after the broker took the request (the outcome is unknown, the caller decides)
            # — unless grpc says it found no connection to send it on (the connection had
            # dropped before: the first call after a broker restart).
            if (
                (was_connected and not _never_sent(exc))
                or self.suspect(SUSPECT_WINDOW_S)
                or not self._ready_within(min(READY_WAIT_S, timeout))
            ):
                self.failed_at = time.monotonic()
                raise
            raw = self._retry_once(stub, request, timeout)
        except wire.BrokerDeadlineExceeded:
            # No answer in time (a partition drops packets, no reset): suspect, so sends
            # steer elsewhere meanwhile; the caller hears of it with a code it retries.
            self.failed_at = time.monotonic()
            raise
        self.failed_at = None
        answer = wire.decode(raw)
        if isinstance(answer, HalfmoonError):
            raise answer
        return answer

    def _retry_once(self, stub: Any, request: bytes, timeout: float) -> bytes:
        try:
            return self._once(stub, request, timeout)
        except (wire.BrokerUnavailable, wire.BrokerDeadlineExceeded):
            self.failed_at = time.monotonic()
            raise

    def _once(self, stub: Any, request: bytes, timeout: float) -> bytes:
        try:
            raw: bytes = stub(
                request,
                timeout=timeout,
                metadata=self.metadata,
                wait_for_ready=False,  # unreachable: fail now, the caller retries or steers
            )
        except grpc.RpcError as exc:
            if not isinstance(exc, grpc.Call) or exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                self._connected = _carried(exc)  # a call that timed out says nothing of it
            raise rpc_error(exc, self.target) from None
        except ValueError:  # grpc's "Cannot invoke RPC on closed channel!"
            self._connected = False
            raise self._closed_error() from None
        self._connected = True
        return raw

    def _ready_within(self, seconds: float) -> bool:
        """Whether the broker answers within ``seconds``: a Hello that waits for the channel
        to connect (rather than grpc's ready future, a connectivity watch: see ``__init__``).
        Any answer counts, an error status too: the transport is up."""
        try:
            self._hello(
                wire.encode({}), timeout=seconds, metadata=self.metadata, wait_for_ready=True
            )
        except grpc.RpcError as exc:
            return _carried(exc)
        except ValueError:  # closed meanwhile
            return False
        return True

    def _closed_error(self) -> wire.BrokerUnavailable:
        return wire.BrokerUnavailable(f"the connection to the broker at {self.target} is closed")

    def suspect(self, window_s: float) -> bool:
        """Whether a call found the broker unreachable within the last ``window_s`` and none
        succeeded since."""
        failed_at = self.failed_at
        return failed_at is not None and time.monotonic() - failed_at < window_s


# Statuses a call gets without an answer from the broker: the transport is not up (or went).
_NOT_CARRIED = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED}
)


# What grpc's pick_first says when a call found no connection to go out on: the request never
# left this process, so sending it again cannot do anything twice.
NO_CONNECTION = "failed to connect to all addresses"


def _never_sent(error: wire.BrokerUnavailable) -> bool:
    return NO_CONNECTION in error.message


def _carried(exc: grpc.RpcError) -> bool:
    """Whether a failed call was answered by the broker's server (e.g. UNIMPLEMENTED)."""
    code = exc.code() if isinstance(exc, grpc.Call) else None
    return code is not None and code not in _NOT_CARRIED


def rpc_error(exc: grpc.RpcError, target: str) -> HalfmoonError:
    """What a failed gRPC call means to the caller, as a ``HalfmoonError``."""
    # A blocking call's error is a grpc.Call; an asyncio call's (AioRpcError) is not, but
    # answers the same two questions.
    has_status = isinstance(exc, grpc.Call | grpc.aio.AioRpcError)
    code = exc.code() if has_status else None  # type: ignore[attr-defined]
    details = (exc.details() if has_status else None) or str(exc)  # type: ignore[attr-defined]
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
