"""halfmoon's Python client: asyncio-native, over RocketMQ 5's gRPC protocol.

    async with Producer("127.0.0.1:8081") as producer:
        receipt = await producer.send(Message("orders", b"...", tag="created"))

See :mod:`halfmoon.client.sync` for the synchronous facade.
"""

from halfmoon.client.connection import Backoff, ClientConfig
from halfmoon.client.consume_transaction import ConsumeTransaction
from halfmoon.client.consumer import RetryPolicy
from halfmoon.client.credentials import Credentials
from halfmoon.client.errors import (
    BadRequest,
    ClientClosed,
    ClientError,
    ConnectionFailed,
    ConsumerGroupNotFound,
    Forbidden,
    IllegalFilterExpression,
    IllegalOffset,
    InvalidReceiptHandle,
    InvalidTransactionId,
    MessageBodyTooLarge,
    MessageTypeMismatch,
    NotFound,
    OffsetNotFound,
    PreconditionFailed,
    ProducerError,
    RequestTimeout,
    ServerError,
    TooManyRequests,
    TopicNotFound,
    TransactionAlreadyEnded,
    TransactionFenced,
    TransactionIncomplete,
    TransactionOutcomeUnknown,
    TransactionRolledBack,
    Unauthorized,
    Unsupported,
)
from halfmoon.client.fault import LatencyFaultPolicy, LatencyFaultTolerance
from halfmoon.client.message import Message, MessageView, SendReceipt
from halfmoon.client.producer import Producer, ProducerStats
from halfmoon.client.pull_consumer import PullConsumer
from halfmoon.client.push_consumer import (
    BROADCASTING,
    CLUSTERING,
    ConsumeResult,
    MessageListener,
    PushConsumer,
)
from halfmoon.client.route import QueueInfo, TopicRoute
from halfmoon.client.selector import MessageSelector
from halfmoon.client.simple_consumer import SimpleConsumer
from halfmoon.client.sync import (
    SyncConsumeTransaction,
    SyncProducer,
    SyncPullConsumer,
    SyncPushConsumer,
    SyncSimpleConsumer,
    SyncTransactionProducer,
)
from halfmoon.client.transaction import (
    Transaction,
    TransactionListener,
    TransactionProducer,
    TransactionResolution,
    TransactionSendResult,
)

__all__ = [
    "Credentials",
    "BROADCASTING",
    "CLUSTERING",
    "Backoff",
    "BadRequest",
    "ClientClosed",
    "ClientConfig",
    "ClientError",
    "ConnectionFailed",
    "ConsumeResult",
    "ConsumeTransaction",
    "ConsumerGroupNotFound",
    "Forbidden",
    "IllegalFilterExpression",
    "IllegalOffset",
    "InvalidReceiptHandle",
    "InvalidTransactionId",
    "LatencyFaultPolicy",
    "LatencyFaultTolerance",
    "Message",
    "MessageBodyTooLarge",
    "MessageListener",
    "MessageSelector",
    "MessageTypeMismatch",
    "MessageView",
    "NotFound",
    "OffsetNotFound",
    "PreconditionFailed",
    "Producer",
    "ProducerError",
    "ProducerStats",
    "PullConsumer",
    "PushConsumer",
    "QueueInfo",
    "RequestTimeout",
    "RetryPolicy",
    "SendReceipt",
    "ServerError",
    "SimpleConsumer",
    "SyncConsumeTransaction",
    "SyncProducer",
    "SyncPullConsumer",
    "SyncPushConsumer",
    "SyncSimpleConsumer",
    "SyncTransactionProducer",
    "TooManyRequests",
    "TopicNotFound",
    "TopicRoute",
    "Transaction",
    "TransactionAlreadyEnded",
    "TransactionFenced",
    "TransactionIncomplete",
    "TransactionOutcomeUnknown",
    "TransactionRolledBack",
    "TransactionListener",
    "TransactionProducer",
    "TransactionResolution",
    "TransactionSendResult",
    "Unauthorized",
    "Unsupported",
]
