"""Blocking calls to a halfmoon server over its gRPC protocol, for Spark's driver and tasks.

Spark runs the connector's code in short-lived Python workers: one task reads
one range of one queue and exits. The asyncio client (with its background
loop, telemetry stream and heartbeats) is built for long-lived processes; a
task needs a handful of plain RPCs, so this module makes them directly with
grpc's synchronous stubs: routes, offsets, bulk reads (``halfmoon.v1.BulkRead``,
with PullMessage for a server without it), half-message sends, group
decisions and consumer-group offsets. Errors come back as the client's typed
exceptions (:mod:`halfmoon.client.errors`), so callers handle one family.

Channels are cached per endpoint and process: a Python worker that Spark
reuses for many tasks connects once.
"""

from __future__ import annotations

import itertools
import socket
import ssl
import threading
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import duration_pb2
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc

from halfmoon.auth.signature import authorization_header, utc_stamp
from halfmoon.bulkread.format import METHOD as BULK_READ_METHOD
from halfmoon.bulkread.format import BulkAnswer, BulkRequest, FormatError
from halfmoon.client.consume_transaction import EXPECTED_OFFSET_HEADER, GROUP_HEADER
from halfmoon.client.credentials import Credentials
from halfmoon.client.endpoints import channel_target, endpoints_pb, endpoints_text, split_endpoints
from halfmoon.client.errors import (
    ClientError,
    error_for_rpc_error,
    error_for_status,
    raise_for_status,
)
from halfmoon.client.message import Message, message_ids, to_wire
from halfmoon.client.transaction import (
    BATCH_TRANSACTION_TIMEOUT_MS,
    GROUP_ID_PREFIX,
    PROPERTY_TRANSACTION_GROUP,
    PROPERTY_TRANSACTION_TIMEOUT,
)
from halfmoon.spark.options import SparkOptionError, TlsOptions

Code = pb.Code

_OPTIONS = (
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)
# Answers that only read: asked again when the proxy asked died under the call.
_READS = frozenset({"QueryRoute", "QueryOffset", "GetOffset"})
_channels: dict[tuple[str, TlsOptions | None], grpc.Channel] = {}
_channels_lock = threading.Lock()
_client_id = f"spark-{uuid.uuid4().hex[:12]}"
_request_seq = itertools.count()
_SEND_METHOD = f"/{svc.DESCRIPTOR.services_by_name['MessagingService'].full_name}/SendMessage"  # type: ignore[attr-defined]


def _read_pem(path: str | None, option: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as pem:
            return pem.read()
    except OSError as exc:
        raise SparkOptionError(
            f"option {option}: cannot read {path} on {socket.gethostname()} "
            f"({exc.strerror or exc}); give a path valid on the driver and every executor "
            "(spark-submit --files ships a file to each)"
        ) from None


def channel_credentials(tls: TlsOptions) -> grpc.ChannelCredentials:
    """gRPC's TLS credentials from the files ``tls`` names (read here, kept nowhere else)."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem(tls.root_certificates, "tlsRootCertificates"),
        private_key=_read_pem(tls.private_key, "tlsPrivateKey"),
        certificate_chain=_read_pem(tls.certificate_chain, "tlsCertificateChain"),
    )


def admin_ssl_context(tls: TlsOptions | None) -> ssl.SSLContext:
    """For an ``https://`` admin API: the same roots (and client certificate) as gRPC."""
    context = ssl.create_default_context()
    if tls is None:
        return context
    roots = _read_pem(tls.root_certificates, "tlsRootCertificates")
    if roots is not None:
        context.load_verify_locations(cadata=roots.decode("ascii", "replace"))
    if tls.certificate_chain is not None and tls.private_key is not None:
        _read_pem(tls.certificate_chain, "tlsCertificateChain")  # a clear error if unreadable
        context.load_cert_chain(tls.certificate_chain, tls.private_key)
    return context


def _channel(endpoint: str, tls: TlsOptions | None = None) -> grpc.Channel:
    with _channels_lock:
        channel = _channels.get((endpoint, tls))
        if channel is None:
            # A list of proxies (``a;b``) is one channel failing over between them.
            target, extra = channel_target(endpoint)
            options = [*_OPTIONS, *extra]
            if tls is None:
                channel = grpc.insecure_channel(target, options=options)
            else:
                channel = grpc.secure_channel(target, channel_credentials(tls), options=options)
            _channels[(endpoint, tls)] = channel
    return channel


def _stub(endpoint: str, tls: TlsOptions | None = None) -> service_pb2_grpc.MessagingServiceStub:
    return service_pb2_grpc.MessagingServiceStub(_channel(endpoint, tls))


def _metadata(
    credentials: Credentials | None = None, extra: tuple[tuple[str, str], ...] = ()
) -> tuple[tuple[str, str], ...]:
    # One client id per user: a server with authentication on binds a client id to the user
    # that signs with it, and a job may read as one user and write as another.
    client_id = _client_id if credentials is None else f"{_client_id}-{credentials.access_key}"
    headers = (
        ("x-mq-client-id", client_id),
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
        ("x-mq-request-id", f"{client_id}-{next(_request_seq)}"),
        *extra,
    )
    if credentials is None:
        return headers
    date = utc_stamp()
    signed = authorization_header(credentials.access_key, credentials.secret_key, date)
    return (*headers, ("x-mq-date-time", date), ("authorization", signed))


@dataclass(frozen=True)
class Queue:
    """One readable queue: its topic, id, broker and the endpoint that serves it."""

    topic: str
    queue_id: int
    broker: str
    endpoint: str

    def to_wire(self) -> pb.MessageQueue:
        endpoints = endpoints_pb(self.endpoint)
        return pb.MessageQueue(
            topic=pb.Resource(name=self.topic),
            id=self.queue_id,
            broker=pb.Broker(name=self.broker, endpoints=endpoints),
        )


@dataclass
class PullAnswer:
    """One PullMessage answer: the wire messages, where to continue, and the status code."""

    messages: list[pb.Message]
    next_offset: int
    code: int
    text: str


class Wire:
    """The RPCs the Spark connector makes, against one access point (``host:port``)."""

    def __init__(
        self,
        endpoint: str,
        credentials: Credentials | None = None,
        timeout: float = 10.0,
        *,
        tls: TlsOptions | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.credentials = credentials
        self.timeout = timeout
        self.tls = tls

    def _call(
        self,
        rpc: str,
        request: Any,
        endpoint: str | None = None,
        timeout: float | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> Any:
        target = endpoint or self.endpoint
        method = getattr(_stub(target, self.tls), rpc)
        try:
            return method(
                request,
                timeout=timeout or self.timeout,
                metadata=_metadata(self.credentials, headers),
            )
        except grpc.RpcError as exc:
            failover = len(split_endpoints(target)) > 1  # one proxy: nothing else to reach
            if not (failover and rpc in _READS and exc.code() is grpc.StatusCode.UNAVAILABLE):
                raise error_for_rpc_error(exc, rpc, target) from None
        # A read sent to a proxy that died under it (``a;b`` lists more than one): once
        # more, waiting for the channel to reach the next proxy of the list. Reads only: a
        # send or a decision may have been applied before its answer was lost.
        try:
            return method(
                request,
                timeout=timeout or self.timeout,
                metadata=_metadata(self.credentials, headers),
                wait_for_ready=True,
            )
        except grpc.RpcError as exc:
            raise error_for_rpc_error(exc, rpc, target) from None

    # -- routes and offsets -----------------------------------------------------------------

    def queues(self, topic: str) -> list[Queue]:
        """The topic's readable queues, ordered by (broker, queue id)."""
        request = svc.QueryRouteRequest(
            topic=pb.Resource(name=topic), endpoints=endpoints_pb(self.endpoint)
        )
        response = self._call("QueryRoute", request)
        raise_for_status(response.status, "QueryRoute")
        out = []
        for mq in response.message_queues:
            if mq.permission not in (pb.Permission.READ, pb.Permission.READ_WRITE):
                continue
            endpoint = endpoints_text(mq.broker.endpoints) or self.endpoint
            out.append(Queue(topic, mq.id, mq.broker.name or endpoint, endpoint))
        return sorted(set(out), key=lambda q: (q.broker, q.queue_id))

    def query_offset(self, queue: Queue, policy: str, timestamp_ms: int | None = None) -> int:
        """``earliest`` (the queue's min offset), ``latest`` (its max) or ``timestamp``."""
        request = svc.QueryOffsetRequest(message_queue=queue.to_wire())
        if policy == "earliest":
            request.query_offset_policy = pb.QueryOffsetPolicy.BEGINNING
        elif policy == "latest":
            request.query_offset_policy = pb.QueryOffsetPolicy.END
        else:
            request.query_offset_policy = pb.QueryOffsetPolicy.TIMESTAMP
            request.timestamp.FromMilliseconds(int(timestamp_ms or 0))
        response = self._call("QueryOffset", request, queue.endpoint)
        raise_for_status(response.status, "QueryOffset")
        return response.offset

    def committed_offset(self, group: str, queue: Queue) -> int | None:
        """The consumer group's committed offset in ``queue`` (None when it never committed)."""
        response = self._call(
            "GetOffset",
            svc.GetOffsetRequest(group=pb.Resource(name=group), message_queue=queue.to_wire()),
            queue.endpoint,
        )
        if response.status.code in (Code.OFFSET_NOT_FOUND, Code.NOT_FOUND):
            return None
        raise_for_status(response.status, "GetOffset")
        return response.offset

    def commit_offset(self, group: str, queue: Queue, offset: int) -> None:
        """Store ``offset`` as the consumer group's position in ``queue`` (UpdateOffset)."""
        request = svc.UpdateOffsetRequest(
            group=pb.Resource(name=group), message_queue=queue.to_wire(), offset=offset
        )
        response = self._call("UpdateOffset", request, queue.endpoint)
        raise_for_status(response.status, "UpdateOffset")

    def commit_offset_in_group(
        self, transaction_group: str, group: str, queue: Queue, offset: int, expected: int
    ) -> None:
        """Store ``offset`` as the group's position in ``queue`` when ``transaction_group``
        commits (halfmoon's transactional UpdateOffset; ``expected``: the committed offset now,
        -1 for none)."""
        request = svc.UpdateOffsetRequest(
            group=pb.Resource(name=group), message_queue=queue.to_wire(), offset=offset
        )
        headers = ((GROUP_HEADER, transaction_group), (EXPECTED_OFFSET_HEADER, str(expected)))
        response = self._call("UpdateOffset", request, queue.endpoint, headers=headers)
        raise_for_status(response.status, "UpdateOffset")

    # -- reading -------------------------------------------------------------------------------

    def pull(
        self,
        group: str,
        queue: Queue,
        offset: int,
        batch: int,
        selector: pb.FilterExpression | None = None,
        wait: float = 0.0,
    ) -> PullAnswer:
        """Up to ``batch`` committed messages of ``queue`` from ``offset`` (PullMessage)."""
        request = svc.PullMessageRequest(
            group=pb.Resource(name=group),
            message_queue=queue.to_wire(),
            offset=offset,
            batch_size=batch,
        )
        if selector is not None:
            request.filter_expression.CopyFrom(selector)
        request.long_polling_timeout.CopyFrom(_duration(wait))
        messages: list[pb.Message] = []
        next_offset, code, text = offset, Code.OK, ""
        try:
            for response in _stub(queue.endpoint, self.tls).PullMessage(
                request, timeout=wait + self.timeout, metadata=_metadata(self.credentials)
            ):
                kind = response.WhichOneof("content")
                if kind == "message":
                    messages.append(response.message)
                elif kind == "next_offset":
                    next_offset = response.next_offset
                elif kind == "status":
                    code, text = response.status.code, response.status.message
        except grpc.RpcError as exc:
            raise error_for_rpc_error(exc, "PullMessage", queue.endpoint) from None
        if code not in (Code.OK, Code.MESSAGE_NOT_FOUND, Code.ILLEGAL_OFFSET):
            raise error_for_status(pb.Status(code=code, message=text), "PullMessage")
        return PullAnswer(messages, next_offset, code, text)

    def bulk_read(
        self,
        group: str,
        queue: Queue,
        offset: int,
        end: int | None,
        max_messages: int,
        max_bytes: int,
        filter: tuple[str, str] | None = None,
        wait: float = 0.0,
    ) -> BulkAnswer:
        """Committed messages of ``queue`` in ``[offset, end)`` as columns, many per call
        (``halfmoon.v1.BulkRead``). Raises :class:`~halfmoon.client.errors.Unsupported` when
        the server does not have it; an answer's ILLEGAL_OFFSET (retention, bounds) is
        returned, not raised."""
        return self.bulk_read_started(
            group, queue, offset, end, max_messages, max_bytes, filter, wait
        ).answer()

    def bulk_read_started(
        self,
        group: str,
        queue: Queue,
        offset: int,
        end: int | None,
        max_messages: int,
        max_bytes: int,
        filter: tuple[str, str] | None = None,
        wait: float = 0.0,
    ) -> PendingBulkRead:
        """:meth:`bulk_read`, sent now and answered later: the caller works on the previous
        answer while the server reads this one (``answer()`` waits for it, ``cancel()`` drops
        it)."""
        kind, expression = filter or ("TAG", "*")
        request = BulkRequest(
            group=group,
            topic=queue.topic,
            queue_id=queue.queue_id,
            offset=offset,
            end_offset=end,
            max_messages=max_messages,
            max_bytes=max_bytes,
            filter_kind=kind,
            filter_expression=expression,
            wait_ms=int(wait * 1000),
        )
        call = _channel(queue.endpoint, self.tls).unary_unary(BULK_READ_METHOD)
        future = call.future(
            request.encode(), timeout=wait + self.timeout, metadata=_metadata(self.credentials)
        )
        return PendingBulkRead(future, queue.endpoint)

    # -- writing: half messages and group decisions ----------------------------------------------

    def send_halves(self, messages: Sequence[Message], group: str) -> None:
        """Store ``messages`` as half messages of transaction group ``group`` (one request per
        topic)."""
        by_topic: dict[str, list[pb.Message]] = {}
        for message in messages:
            message.properties[PROPERTY_TRANSACTION_GROUP] = group
            message.properties[PROPERTY_TRANSACTION_TIMEOUT] = str(BATCH_TRANSACTION_TIMEOUT_MS)
            by_topic.setdefault(message.topic, []).append(
                to_wire(message, message_ids.next(), transactional=True)
            )
        for wire_messages in by_topic.values():
            response = self._call(
                "SendMessage",
                svc.SendMessageRequest(messages=wire_messages),
                timeout=max(self.timeout, 30.0),
            )
            if response.status.code != Code.OK:
                raise error_for_status(response.status, "SendMessage")
            for entry in response.entries:
                raise_for_status(entry.status, "SendMessage")

    def send_encoded_halves(self, request: bytes, count: int) -> None:
        """Send a ``SendMessageRequest`` already encoded (:mod:`halfmoon.spark.half_wire`) that
        holds ``count`` half messages; raises unless every one is stored."""
        call = _channel(self.endpoint, self.tls).unary_unary(
            _SEND_METHOD, response_deserializer=svc.SendMessageResponse.FromString
        )
        try:
            response = call(
                request,
                timeout=max(self.timeout, 30.0),
                metadata=_metadata(self.credentials),
            )
        except grpc.RpcError as exc:
            raise error_for_rpc_error(exc, "SendMessage", self.endpoint) from None
        if response.status.code != Code.OK:
            raise error_for_status(response.status, "SendMessage")
        if len(response.entries) != count:
            raise ClientError(
                f"{self.endpoint}: SendMessage answered {len(response.entries)} entries for "
                f"{count} messages",
                rpc="SendMessage",
            )
        for entry in response.entries:
            if entry.status.code != Code.OK:
                raise_for_status(entry.status, "SendMessage")

    def end_group(self, group: str, topic: str, commit: bool) -> None:
        """Commit or roll back transaction group ``group`` (idempotent; the opposite decision
        fails)."""
        request = svc.EndTransactionRequest(
            topic=pb.Resource(name=topic),
            message_id="",
            transaction_id=GROUP_ID_PREFIX + group,
            resolution=pb.TransactionResolution.COMMIT
            if commit
            else pb.TransactionResolution.ROLLBACK,
            source=pb.TransactionSource.SOURCE_CLIENT,
        )
        response = self._call("EndTransaction", request, timeout=max(self.timeout, 60.0))
        raise_for_status(response.status, "EndTransaction")


def group_decided(error: ClientError) -> str | None:
    """``committed`` / ``rolled back`` when ``error`` says a transaction group was already
    decided."""
    text = str(error)
    for state in ("committed", "rolled back"):
        if f"already {state}" in text:
            return state
    return None


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromMilliseconds(int(seconds * 1000))
    return d


def chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class PendingBulkRead:
    """A BulkRead in flight (:meth:`Wire.bulk_read_started`)."""

    def __init__(self, future: Any, endpoint: str) -> None:
        self._future = future
        self._endpoint = endpoint

    def answer(self) -> BulkAnswer:
        """The answer (waits for it); raises as :meth:`Wire.bulk_read` does."""
        try:
            raw = self._future.result()
        except grpc.RpcError as exc:  # UNIMPLEMENTED: Unsupported
            raise error_for_rpc_error(exc, "BulkRead", self._endpoint) from None
        try:
            answer = BulkAnswer.decode(raw)
        except FormatError as exc:
            raise ClientError(f"{self._endpoint}: {exc}", rpc="BulkRead") from None
        if answer.code not in (Code.OK, Code.ILLEGAL_OFFSET):
            raise error_for_status(pb.Status(code=answer.code, message=answer.message), "BulkRead")
        return answer

    def cancel(self) -> None:
        self._future.cancel()
