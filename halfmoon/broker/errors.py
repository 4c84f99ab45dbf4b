"""Errors the broker raises on purpose, one class per thing a user can get wrong.

Codes are the RocketMQ 5 protocol's ``Code`` names, so the gRPC servicer maps
them one to one (``TOPIC_EXISTS`` has no protocol code; the server sends it as
``BAD_REQUEST``). Messages say what to do next.
"""

from __future__ import annotations

# Defined beside the receipt codec, which raises them; one class each, re-exported here.
from halfmoon.broker.receipt import IllegalInvisibleTime, InvalidReceiptHandle
from halfmoon.errors import Conflict, HalfmoonError, InvalidArgument, NotFound

# The store refuses these before anything is written; the broker raises the same classes.
from halfmoon.store.validate import (
    IllegalQueueId,
    IllegalTopic,
    MessageBodyTooLarge,
    MessagePropertiesTooLarge,
)


class TopicNotFound(NotFound):
    code = "TOPIC_NOT_FOUND"

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} does not exist; create it first (halfmoon topic create)")
        self.topic = topic


class TopicExists(Conflict):
    code = "TOPIC_EXISTS"
    protocol_code = "BAD_REQUEST"  # RocketMQ has no "exists" Code

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic!r} already exists; use update to change it")
        self.topic = topic


class GroupNotFound(NotFound):
    code = "CONSUMER_GROUP_NOT_FOUND"

    def __init__(self, group: str) -> None:
        super().__init__(f"consumer group {group!r} does not exist; create it first")
        self.group = group


class GroupExists(Conflict):
    code = "CONSUMER_GROUP_EXISTS"
    protocol_code = "BAD_REQUEST"  # RocketMQ has no "exists" Code

    def __init__(self, group: str) -> None:
        super().__init__(f"consumer group {group!r} already exists; use update to change it")
        self.group = group


class IllegalGroup(InvalidArgument):
    code = "ILLEGAL_CONSUMER_GROUP"


class MessageTypeMismatch(InvalidArgument):
    code = "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"


class IllegalDeliveryTime(InvalidArgument):
    code = "ILLEGAL_DELIVERY_TIME"


class IllegalMessageTag(InvalidArgument):
    code = "ILLEGAL_MESSAGE_TAG"


class IllegalMessageKey(InvalidArgument):
    code = "ILLEGAL_MESSAGE_KEY"


class IllegalMessageGroup(InvalidArgument):
    code = "ILLEGAL_MESSAGE_GROUP"


class IllegalMessageId(InvalidArgument):
    code = "ILLEGAL_MESSAGE_ID"


class BodyDigestMismatch(InvalidArgument):
    code = "MESSAGE_CORRUPTED"


class IllegalOffset(InvalidArgument):
    code = "ILLEGAL_OFFSET"


class OffsetNotFound(NotFound):
    code = "OFFSET_NOT_FOUND"


class PermissionDenied(HalfmoonError):
    code = "FORBIDDEN"
    http_status = 403


__all__ = [
    "BodyDigestMismatch",
    "GroupExists",
    "GroupNotFound",
    "IllegalDeliveryTime",
    "IllegalGroup",
    "IllegalInvisibleTime",
    "IllegalMessageGroup",
    "IllegalMessageId",
    "IllegalMessageKey",
    "IllegalMessageTag",
    "IllegalOffset",
    "IllegalQueueId",
    "IllegalTopic",
    "InvalidReceiptHandle",
    "MessageBodyTooLarge",
    "MessagePropertiesTooLarge",
    "MessageTypeMismatch",
    "OffsetNotFound",
    "PermissionDenied",
    "TopicExists",
    "TopicNotFound",
]
