"""Errors on the wire: a halfmoon error becomes the protocol's ``Code``.

Each error class names its protocol Code (``protocol_code``, see
:mod:`halfmoon.errors`); this module only turns the name into the number. An
error raised with a code of its own (``InvalidArgument(..., code="MESSAGE_BODY_EMPTY")``)
answers with that code when it is a protocol Code name. Anything that is not
a :class:`HalfmoonError` is a bug: it is logged with its traceback and
answered with INTERNAL_ERROR, never allowed to take the server down.

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

PROTOCOL_CODES: dict[str, int] = {value.name: value.number for value in Code.DESCRIPTOR.values}


def code_for(error: HalfmoonError) -> int:
    """The protocol Code for a halfmoon error."""
    cls = type(error)
    name = cls.protocol_code
    if error.code != cls.code and error.code in PROTOCOL_CODES:
        name = error.code  # raised with a protocol code of its own
    # Every class's name exists (tests/test_errors.py); INTERNAL_ERROR is the safe answer anyway.
    return PROTOCOL_CODES.get(name, Code.INTERNAL_ERROR)


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
    http_status = 400


class Unsupported(HalfmoonError):
    code = "UNSUPPORTED"
