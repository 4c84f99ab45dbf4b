"""halfmoon's broker: topics, groups, send, pop and pull consumption over a store.

Plain synchronous Python objects; no sockets, no protobuf. The server calls
:class:`Broker`; tests drive it directly with a :class:`FakeClock`.
"""

from halfmoon.broker.broker import Broker, PullResult, QueueProgress, QueueRoute, QueueStatus
from halfmoon.broker.clock import Clock, FakeClock, SystemClock
from halfmoon.broker.config import BrokerConfig
from halfmoon.broker.errors import (
    BodyDigestMismatch,
    GroupExists,
    GroupNotFound,
    IllegalDeliveryTime,
    IllegalGroup,
    IllegalInvisibleTime,
    IllegalMessageGroup,
    IllegalMessageId,
    IllegalMessageKey,
    IllegalMessageTag,
    IllegalOffset,
    IllegalQueueId,
    IllegalTopic,
    InvalidReceiptHandle,
    MessageBodyTooLarge,
    MessagePropertiesTooLarge,
    MessageTypeMismatch,
    OffsetNotFound,
    PermissionDenied,
    TopicExists,
    TopicNotFound,
)
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.groups import GroupConfig, RetryPolicy
from halfmoon.broker.message import MessageType, MessageView, OutgoingMessage, new_message_id
from halfmoon.broker.produce import SendResult, verify_body_digest
from halfmoon.broker.stats import BrokerStatus
from halfmoon.broker.topics import TIMER_TOPIC, TopicConfig, dead_letter_topic
from halfmoon.store.api import GetStatus

__all__ = [
    "BodyDigestMismatch",
    "Broker",
    "BrokerConfig",
    "BrokerStatus",
    "Clock",
    "FakeClock",
    "FilterSpec",
    "GetStatus",
    "GroupConfig",
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
    "MessageType",
    "MessageTypeMismatch",
    "MessageView",
    "OffsetNotFound",
    "OutgoingMessage",
    "PermissionDenied",
    "PullResult",
    "QueueProgress",
    "QueueRoute",
    "QueueStatus",
    "RetryPolicy",
    "SendResult",
    "SystemClock",
    "TIMER_TOPIC",
    "TopicConfig",
    "TopicExists",
    "TopicNotFound",
    "dead_letter_topic",
    "new_message_id",
    "verify_body_digest",
]
