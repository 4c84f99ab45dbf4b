"""Typed exceptions for the client, one per thing a caller can act on.

The server answers every RPC with a protocol ``Status``; :func:`raise_for_status`
turns a non-OK status into the matching exception below, so callers write
``except TopicNotFound`` instead of comparing numbers. Each class keeps the
protocol's ``Code`` name as its stable ``code`` and says whether retrying the
same request can help (``retryable``), which the producer's retry loop reads.
Transport failures (the server is down, a deadline passed) have their own
classes because they carry no protocol status.
"""

from __future__ import annotations

import grpc
from rocketmq.grpc_protocol import definition_pb2

from halfmoon.errors import HalfmoonError

Code = definition_pb2.Code


class ClientError(HalfmoonError):
    """Base of every error :mod:`halfmoon.client` raises."""

    code = "INTERNAL_ERROR"
    retryable = False

    def __init__(self, message: str, *, code: str | None = None, rpc: str = "") -> None:
        super().__init__(message, code=code)
        self.rpc = rpc


class BadRequest(ClientError):
    """The server refused the request as malformed (a name, a tag, a property...)."""

    code = "BAD_REQUEST"


class IllegalFilterExpression(BadRequest):
    """A tag or SQL92 selector the server cannot compile; the message says where."""

    code = "ILLEGAL_FILTER_EXPRESSION"


class MessageTypeMismatch(BadRequest):
    """The message's type (normal, FIFO, delay, transaction) is not one the topic accepts."""

    code = "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"


class InvalidReceiptHandle(BadRequest):
    """The receipt handle is unknown or expired: the message became visible again."""

    code = "INVALID_RECEIPT_HANDLE"


class IllegalOffset(BadRequest):
    """An offset outside the queue's range."""

    code = "ILLEGAL_OFFSET"


class InvalidTransactionId(BadRequest):
    """The transaction id is unknown to the server (already ended or never begun)."""

    code = "INVALID_TRANSACTION_ID"


class MessageBodyTooLarge(BadRequest):
    """A single message body beyond the server's limit; batches are split, bodies are not."""

    code = "MESSAGE_BODY_TOO_LARGE"


class NotFound(ClientError):
    code = "NOT_FOUND"


class TopicNotFound(NotFound):
    """The topic does not exist; create it (``halfmoon topic create``) or enable auto-creation."""

    code = "TOPIC_NOT_FOUND"


class ConsumerGroupNotFound(NotFound):
    """The consumer group does not exist; create it (``halfmoon group create``)."""

    code = "CONSUMER_GROUP_NOT_FOUND"


class OffsetNotFound(NotFound):
    """The group has no committed offset for the queue yet."""

    code = "OFFSET_NOT_FOUND"


class Forbidden(ClientError):
    """The topic or queue does not permit this (e.g. writing to a read-only topic)."""

    code = "FORBIDDEN"


class Unauthorized(ClientError):
    code = "UNAUTHORIZED"


class PreconditionFailed(ClientError):
    code = "PRECONDITION_FAILED"


class TransactionFenced(PreconditionFailed):
    """A transaction's ack or offset commit no longer holds (the message went to another
    consumer, the queue was committed by another member): the broker rolled it all back."""

    code = "TRANSACTION_FENCED"
    protocol_code = "PRECONDITION_FAILED"


class TransactionIncomplete(PreconditionFailed):
    """The broker restarted during the transaction and lost some of its acks: rolled back."""

    code = "TRANSACTION_INCOMPLETE"
    protocol_code = "PRECONDITION_FAILED"


class TransactionAlreadyEnded(BadRequest):
    """A rollback of a transaction group already committed (a retried rollback after a
    commit whose answer was lost): the commit stands."""

    code = "TRANSACTION_ALREADY_ENDED"
    protocol_code = "BAD_REQUEST"


class TransactionRolledBack(PreconditionFailed):
    """A commit found its transaction group already rolled back (by a rollback, an operator
    or the broker's transaction timeout): nothing of it was applied."""

    code = "TRANSACTION_ROLLED_BACK"
    protocol_code = "PRECONDITION_FAILED"


class TransactionOutcomeUnknown(ClientError):
    """A commit or rollback got no answer (the broker died, the connection dropped, the
    request timed out): it may or may not have been applied. Call it again: the retry
    reaches the broker and returns the real outcome. ``__cause__`` is the transport error."""

    code = "TRANSACTION_OUTCOME_UNKNOWN"
    protocol_code = "INTERNAL_ERROR"  # raised in the client, never sent
    retryable = True


class TooManyRequests(ClientError):
    """The server is throttling; back off and retry."""

    code = "TOO_MANY_REQUESTS"
    retryable = True


class Unsupported(ClientError):
    """The server does not offer this feature (yet)."""

    code = "UNSUPPORTED"


class ServerError(ClientError):
    """The server failed internally; retrying may succeed, the server log says more."""

    code = "INTERNAL_SERVER_ERROR"
    retryable = True


class RequestTimeout(ClientError):
    """No answer within the request timeout (the client's or the server's)."""

    code = "REQUEST_TIMEOUT"
    retryable = True


class ConnectionFailed(ClientError):
    """The server could not be reached (down, restarting, wrong address)."""

    code = "UNAVAILABLE"
    protocol_code = "INTERNAL_ERROR"  # raised in the client, never sent
    retryable = True


class ClientClosed(ClientError):
    """The client was closed (or never started); create or start a new one."""

    code = "CLIENT_CLOSED"
    protocol_code = "INTERNAL_ERROR"  # raised in the client, never sent


class ProducerError(ClientError):
    """A send failed after every retry; ``__cause__`` is the last attempt's error."""

    code = "SEND_FAILED"
    protocol_code = "INTERNAL_ERROR"  # raised in the client, never sent


_BY_CODE: dict[int, type[ClientError]] = {
    Code.BAD_REQUEST: BadRequest,
    Code.ILLEGAL_ACCESS_POINT: BadRequest,
    Code.ILLEGAL_TOPIC: BadRequest,
    Code.ILLEGAL_CONSUMER_GROUP: BadRequest,
    Code.ILLEGAL_MESSAGE_TAG: BadRequest,
    Code.ILLEGAL_MESSAGE_KEY: BadRequest,
    Code.ILLEGAL_MESSAGE_GROUP: BadRequest,
    Code.ILLEGAL_MESSAGE_PROPERTY_KEY: BadRequest,
    Code.ILLEGAL_MESSAGE_ID: BadRequest,
    Code.ILLEGAL_INVISIBLE_TIME: BadRequest,
    Code.ILLEGAL_DELIVERY_TIME: BadRequest,
    Code.ILLEGAL_POLLING_TIME: BadRequest,
    Code.MESSAGE_BODY_EMPTY: BadRequest,
    Code.MESSAGE_CORRUPTED: BadRequest,
    Code.CLIENT_ID_REQUIRED: BadRequest,
    Code.UNRECOGNIZED_CLIENT_TYPE: BadRequest,
    Code.PAYLOAD_TOO_LARGE: BadRequest,
    Code.MESSAGE_PROPERTIES_TOO_LARGE: BadRequest,
    Code.REQUEST_HEADER_FIELDS_TOO_LARGE: BadRequest,
    Code.ILLEGAL_FILTER_EXPRESSION: IllegalFilterExpression,
    Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE: MessageTypeMismatch,
    Code.INVALID_RECEIPT_HANDLE: InvalidReceiptHandle,
    Code.ILLEGAL_OFFSET: IllegalOffset,
    Code.INVALID_TRANSACTION_ID: InvalidTransactionId,
    Code.MESSAGE_BODY_TOO_LARGE: MessageBodyTooLarge,
    Code.NOT_FOUND: NotFound,
    Code.MESSAGE_NOT_FOUND: NotFound,
    Code.TOPIC_NOT_FOUND: TopicNotFound,
    Code.CONSUMER_GROUP_NOT_FOUND: ConsumerGroupNotFound,
    Code.OFFSET_NOT_FOUND: OffsetNotFound,
    Code.FORBIDDEN: Forbidden,
    Code.UNAUTHORIZED: Unauthorized,
    Code.PAYMENT_REQUIRED: Unauthorized,
    Code.PRECONDITION_FAILED: PreconditionFailed,
    Code.TOO_MANY_REQUESTS: TooManyRequests,
    Code.REQUEST_TIMEOUT: RequestTimeout,
    Code.PROXY_TIMEOUT: RequestTimeout,
    Code.MASTER_PERSISTENCE_TIMEOUT: RequestTimeout,
    Code.SLAVE_PERSISTENCE_TIMEOUT: RequestTimeout,
    Code.HA_NOT_AVAILABLE: ServerError,
    Code.INTERNAL_ERROR: ServerError,
    Code.INTERNAL_SERVER_ERROR: ServerError,
    Code.NOT_IMPLEMENTED: Unsupported,
    Code.UNSUPPORTED: Unsupported,
    Code.VERSION_UNSUPPORTED: Unsupported,
    Code.VERIFY_FIFO_MESSAGE_UNSUPPORTED: Unsupported,
}

_BY_OWN_CODE: dict[str, type[ClientError]] = {
    TransactionFenced.code: TransactionFenced,
    TransactionIncomplete.code: TransactionIncomplete,
    TransactionRolledBack.code: TransactionRolledBack,
    TransactionAlreadyEnded.code: TransactionAlreadyEnded,
}


def error_for_status(status: definition_pb2.Status, rpc: str = "") -> ClientError:
    """The exception for a non-OK protocol status (``code`` is the protocol's Code name)."""
    cls = _BY_CODE.get(status.code, ClientError)
    name = Code.Name(status.code) if status.code in Code.values() else str(status.code)
    # halfmoon's own codes that share a protocol Code open the message ("CODE: ...").
    own = _BY_OWN_CODE.get(status.message.split(":", 1)[0]) if status.message else None
    if own is not None:
        cls, name = own, own.code
    text = status.message or name
    where = f"{rpc}: " if rpc else ""
    return cls(f"{where}{text}", code=name, rpc=rpc)


def raise_for_status(status: definition_pb2.Status, rpc: str = "") -> None:
    """Raise the typed exception for ``status`` unless it is OK."""
    if status.code != Code.OK:
        raise error_for_status(status, rpc)


_TRANSPORT_TIMEOUT = {grpc.StatusCode.DEADLINE_EXCEEDED}
_TRANSPORT_DOWN = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.ABORTED,
}


def error_for_rpc_error(exc: grpc.RpcError, rpc: str, target: str) -> ClientError:
    """A transport-level failure (no protocol status) as a typed client error."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code in _TRANSPORT_TIMEOUT:
        return RequestTimeout(
            f"{rpc} to {target} got no answer in time; the server may be overloaded", rpc=rpc
        )
    if code in _TRANSPORT_DOWN:
        return ConnectionFailed(
            f"{rpc} to {target} failed: {details}; is the server running?", rpc=rpc
        )
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return BadRequest(
            f"{rpc} to {target} was too large for the transport: {details}",
            code="PAYLOAD_TOO_LARGE",
            rpc=rpc,
        )
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return Unsupported(f"{rpc} is not implemented by the server at {target}", rpc=rpc)
    name = code.name if code is not None else "UNKNOWN"
    return ServerError(
        f"{rpc} to {target} failed with {name}: {details}", code="INTERNAL_ERROR", rpc=rpc
    )
