"""Errors on the wire: halfmoon error codes become the protocol's ``Code``.

halfmoon's error codes are the protocol's Code names wherever one exists, so
the mapping is by name; the few halfmoon-only codes have a row in
``_ALIASES``. Anything that is not a :class:`HalfmoonError` is a bug: it is
logged with its traceback and answered with INTERNAL_ERROR, never allowed to
take the server down.

Where Apache RocketMQ's proxy words the same failure in a way its official
clients' users (and the clients' own tests) look for, that wording follows
halfmoon's sentence in the Status message (:func:`rocketmq_wording`).
"""

from __future__ import annotations

import logging

from rocketmq.grpc_protocol import definition_pb2

from halfmoon.errors import HalfmoonError

log = logging.getLogger("halfmoon.server")

Code = definition_pb2.Code

# halfmoon codes that are not protocol Code names.
_ALIASES: dict[str, str] = {
    "TOPIC_EXISTS": "BAD_REQUEST",
    "GROUP_EXISTS": "BAD_REQUEST",
    "CONSUMER_GROUP_EXISTS": "BAD_REQUEST",
    "CONFLICT": "PRECONDITION_FAILED",
    "STORAGE_ERROR": "INTERNAL_ERROR",
    "STORAGE_CORRUPTED": "INTERNAL_ERROR",
    "STORE_CLOSED": "INTERNAL_ERROR",
    "ILLEGAL_PERMISSION": "FORBIDDEN",
    "PERMISSION_DENIED": "FORBIDDEN",
    "MESSAGE_TOO_LARGE": "MESSAGE_BODY_TOO_LARGE",
    "BODY_TOO_LARGE": "MESSAGE_BODY_TOO_LARGE",
    "ILLEGAL_MESSAGE": "BAD_REQUEST",
    "GROUP_NOT_FOUND": "CONSUMER_GROUP_NOT_FOUND",
    "ILLEGAL_GROUP": "ILLEGAL_CONSUMER_GROUP",
    "TRANSACTION_NOT_FOUND": "INVALID_TRANSACTION_ID",
    "TRANSACTION_ALREADY_ENDED": "BAD_REQUEST",
    "NOT_IMPLEMENTED": "NOT_IMPLEMENTED",
}

_NAMES = {value.name: value.number for value in Code.DESCRIPTOR.values}


def code_for(error: HalfmoonError) -> int:
    """The protocol Code for a halfmoon error (BAD_REQUEST for an unknown user error)."""
    name = _ALIASES.get(error.code, error.code)
    number = _NAMES.get(name)
    if number is None or number == Code.CODE_UNSPECIFIED:
        # A user error whose code the protocol lacks: still the caller's fault.
        return Code.INTERNAL_ERROR if error.code.startswith("INTERNAL") else Code.BAD_REQUEST
    return number


def status(code: int, message: str = "") -> definition_pb2.Status:
    return definition_pb2.Status(code=code, message=message or Code.Name(code))


def ok() -> definition_pb2.Status:
    return definition_pb2.Status(code=Code.OK, message="OK")


def rocketmq_wording(error: HalfmoonError) -> str:
    """RocketMQ's own text for ``error`` ("" where halfmoon keeps only its own).

    Unknown topic: the proxy's TopicRouteService raises MQClientException(17,
    "No topic route info in name server for the topic: <topic>"), whose message
    (the Status message) reads "CODE: 17  DESC: ..." (the FAQ link it adds is
    left out). Unknown group: the broker's PopMessageProcessor remark,
    "subscription group [<group>] does not exist" (its FAQ tip left out).
    """
    code = error.code
    if code == "TOPIC_NOT_FOUND":
        topic = getattr(error, "topic", None)
        if topic:
            return f"CODE: 17  DESC: No topic route info in name server for the topic: {topic}"
    elif code in ("CONSUMER_GROUP_NOT_FOUND", "GROUP_NOT_FOUND"):
        group = getattr(error, "group", None)
        if group:
            return f"subscription group [{group}] does not exist"
    return ""


def status_for(error: BaseException, rpc: str = "") -> definition_pb2.Status:
    """The Status to answer for ``error``; unexpected errors are logged as bugs."""
    if isinstance(error, HalfmoonError):
        message = error.message
        theirs = rocketmq_wording(error)
        if theirs:
            message = f"{message}. {theirs}"
        return status(code_for(error), message)
    log.error("event=rpc_internal_error rpc=%s error=%r", rpc, error, exc_info=error)
    return status(
        Code.INTERNAL_ERROR,
        f"internal error in {rpc or 'the server'}: {type(error).__name__}; see the server log",
    )


class RequestError(HalfmoonError):
    """A request the server rejects before it reaches the broker (malformed protocol input)."""

    code = "BAD_REQUEST"


class Unsupported(HalfmoonError):
    code = "UNSUPPORTED"
