"""What the consumers share: a group, subscriptions, and the receive / ack / pull RPCs.

Consumers announce their group and subscriptions (topic → selector) in their
Settings; the server answers with the group's rules: FIFO or not, the
maximum delivery attempts and the retry backoff. :class:`RetryPolicy` is that
answer, used by the push consumer to decide when a failed message comes back
and when it goes to the dead-letter queue.

The RPC helpers here return :class:`MessageView` objects and raise typed
errors; "no message" is an empty list, not an error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import duration_pb2
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.client.client import BaseClient
from halfmoon.client.connection import ClientConfig
from halfmoon.client.consume_transaction import ConsumeTransaction
from halfmoon.client.errors import InvalidReceiptHandle, error_for_status, raise_for_status
from halfmoon.client.message import MessageView, view_of
from halfmoon.client.route import QueueInfo
from halfmoon.client.selector import ALL, MessageSelector
from halfmoon.client.transaction import TransactionProducer


@dataclass(frozen=True)
class RetryPolicy:
    """The group's redelivery rule: how many deliveries in all, and the wait before each retry."""

    max_attempts: int = 17
    kind: str = "customized"
    delays: tuple[float, ...] = (
        1,
        5,
        10,
        30,
        60,
        120,
        180,
        240,
        300,
        360,
        420,
        480,
        540,
        600,
        1200,
        1800,
        3600,
        7200,
    )
    initial: float = 1.0
    maximum: float = 7200.0
    multiplier: float = 2.0

    def delay(self, attempt: int) -> float:
        """Seconds before redelivering after failed delivery number ``attempt`` (1-based)."""
        attempt = max(attempt, 1)
        if self.kind == "exponential":
            return min(self.initial * self.multiplier ** (attempt - 1), self.maximum)
        return self.delays[min(attempt, len(self.delays)) - 1] if self.delays else 1.0

    @classmethod
    def from_wire(cls, policy: pb.RetryPolicy) -> RetryPolicy:
        attempts = policy.max_attempts or 17
        if policy.HasField("exponential_backoff"):
            exp = policy.exponential_backoff
            return cls(
                attempts,
                "exponential",
                (),
                exp.initial.ToMilliseconds() / 1000,
                exp.max.ToMilliseconds() / 1000,
                exp.multiplier or 2.0,
            )
        if policy.HasField("customized_backoff") and policy.customized_backoff.next:
            return cls(
                attempts,
                "customized",
                tuple(d.ToMilliseconds() / 1000 for d in policy.customized_backoff.next),
            )
        return cls(attempts)


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromMilliseconds(int(seconds * 1000))
    return d


class ConsumerBase(BaseClient):
    """A client of one consumer group with topic subscriptions."""

    def __init__(
        self,
        config: ClientConfig,
        group: str,
        subscriptions: Mapping[str, MessageSelector] | None = None,
    ) -> None:
        super().__init__(config)
        if not group:
            raise ValueError("a consumer needs a consumer group name")
        self.group = group
        self.subscriptions: dict[str, MessageSelector] = dict(subscriptions or {})
        self.fifo = False
        self.retry_policy = RetryPolicy()
        self.receive_batch_size = 32
        self.long_polling_timeout = 20.0
        self._group_pb = pb.Resource(name=group, resource_namespace=config.namespace)

    # -- settings ------------------------------------------------------------------------

    def _group_resource(self) -> pb.Resource | None:
        return self._group_pb

    def _settings(self) -> pb.Settings:
        settings = super()._settings()
        sub = settings.subscription
        sub.group.CopyFrom(self._group_pb)
        for topic, selector in self.subscriptions.items():
            sub.subscriptions.append(
                pb.SubscriptionEntry(topic=self._topic(topic), expression=selector.to_wire())
            )
        return settings

    def _apply_settings(self, settings: pb.Settings) -> None:
        super()._apply_settings(settings)
        sub = settings.subscription
        self.fifo = sub.fifo
        if sub.receive_batch_size > 0:
            self.receive_batch_size = sub.receive_batch_size
        if sub.HasField("long_polling_timeout") and sub.long_polling_timeout.ToMilliseconds() > 0:
            self.long_polling_timeout = sub.long_polling_timeout.ToMilliseconds() / 1000
        if settings.HasField("backoff_policy"):
            self.retry_policy = RetryPolicy.from_wire(settings.backoff_policy)

    async def _on_started(self) -> None:
        for topic in self.subscriptions:
            await self.routes.get(topic)

    async def subscribe(self, topic: str, selector: MessageSelector = ALL) -> None:
        """Add (or change) a subscription; the server validates the selector right away."""
        self._check_open()
        await self.routes.get(topic)
        self.subscriptions[topic] = selector
        self._resend_settings()

    async def unsubscribe(self, topic: str) -> None:
        """Stop receiving from ``topic``."""
        self.subscriptions.pop(topic, None)
        self._resend_settings()

    def _topic(self, topic: str) -> pb.Resource:
        return pb.Resource(name=topic, resource_namespace=self.config.namespace)

    # -- pop consumption ----------------------------------------------------------------

    async def _receive(
        self, topic: str, selector: MessageSelector, batch: int, invisible: float, wait: float
    ) -> list[MessageView]:
        route = await self.routes.get(topic)
        endpoint = route.queues[0].endpoint if route.queues else self._pool.access_point.target
        request = svc.ReceiveMessageRequest(
            group=self._group_pb,
            message_queue=pb.MessageQueue(topic=self._topic(topic), id=-1),
            filter_expression=selector.to_wire(),
            batch_size=batch,
            auto_renew=False,
        )
        request.invisible_duration.FromMilliseconds(int(invisible * 1000))
        request.long_polling_timeout.FromMilliseconds(int(wait * 1000))
        views: list[MessageView] = []
        connection = self._pool.get(endpoint)
        async for response in connection.stream(
            "ReceiveMessage", request, timeout=wait + self.config.request_timeout
        ):
            kind = response.WhichOneof("content")
            if kind == "status":
                if response.status.code == pb.Code.MESSAGE_NOT_FOUND:
                    return []
                raise_for_status(response.status, "ReceiveMessage")
            elif kind == "message":
                views.append(view_of(response.message, endpoint))
        return views

    async def _ack(self, message: MessageView, headers: tuple[tuple[str, str], ...] = ()) -> None:
        request = svc.AckMessageRequest(
            group=self._group_pb,
            topic=self._topic(message.topic),
            entries=[
                svc.AckMessageEntry(message_id=message.message_id, receipt_handle=_handle(message))
            ],
        )
        response = await self._pool.get(message.endpoint or self._pool.access_point.target).call(
            "AckMessage", request, headers=headers
        )
        if response.status.code != pb.Code.OK:
            for entry in response.entries:
                raise_for_status(entry.status, "AckMessage")
            raise_for_status(response.status, "AckMessage")

    async def _change_invisible(
        self, message: MessageView, seconds: float, headers: tuple[tuple[str, str], ...] = ()
    ) -> str:
        request = svc.ChangeInvisibleDurationRequest(
            group=self._group_pb,
            topic=self._topic(message.topic),
            receipt_handle=_handle(message),
            invisible_duration=_duration(seconds),
            message_id=message.message_id,
        )
        response = await self._pool.get(message.endpoint or self._pool.access_point.target).call(
            "ChangeInvisibleDuration", request, headers=headers
        )
        raise_for_status(response.status, "ChangeInvisibleDuration")
        message.receipt_handle = response.receipt_handle
        return response.receipt_handle

    async def _forward_to_dead_letter(
        self, message: MessageView, max_attempts: int, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        request = svc.ForwardMessageToDeadLetterQueueRequest(
            group=self._group_pb,
            topic=self._topic(message.topic),
            receipt_handle=_handle(message),
            message_id=message.message_id,
            delivery_attempt=message.delivery_attempt,
            max_delivery_attempts=max_attempts,
        )
        response = await self._pool.get(message.endpoint or self._pool.access_point.target).call(
            "ForwardMessageToDeadLetterQueue", request, headers=headers
        )
        raise_for_status(response.status, "ForwardMessageToDeadLetterQueue")

    def transaction(
        self,
        producer: TransactionProducer | None = None,
        *,
        group: str | None = None,
        timeout: float | None = None,
    ) -> ConsumeTransaction:
        """A transaction holding this consumer's acks, rejects (and, for a pull consumer, offset
        commits) and ``producer``'s sends, committed atomically (docs/transactions.md).

        ``async with consumer.transaction(producer) as tx: await tx.send(m); await tx.ack(r)``.
        An ack outside a transaction stays a plain ack. ``timeout`` (seconds): undecided
        this long after its first send, the broker rolls it back (None: the producer's
        ``transaction_timeout``, else the broker's default, 60 s).
        """
        self._check_open()
        return ConsumeTransaction(self, producer, group=group, timeout=timeout)

    # -- offset consumption -------------------------------------------------------------

    async def _pull(
        self, queue: QueueInfo, offset: int, batch: int, selector: MessageSelector, wait: float
    ) -> tuple[list[MessageView], int]:
        """Messages at ``offset`` of ``queue`` and the offset to continue from."""
        request = svc.PullMessageRequest(
            group=self._group_pb,
            message_queue=queue.to_wire(self.config.namespace),
            offset=offset,
            batch_size=batch,
            filter_expression=selector.to_wire(),
        )
        request.long_polling_timeout.FromMilliseconds(int(wait * 1000))
        views: list[MessageView] = []
        next_offset = offset
        error = None
        async for response in self._pool.get(queue.endpoint).stream(
            "PullMessage", request, timeout=wait + self.config.request_timeout
        ):
            kind = response.WhichOneof("content")
            if kind == "status":
                code = response.status.code
                if code not in (pb.Code.OK, pb.Code.MESSAGE_NOT_FOUND, pb.Code.ILLEGAL_OFFSET):
                    error = error_for_status(response.status, "PullMessage")
            elif kind == "message":
                views.append(view_of(response.message, queue.endpoint))
            elif kind == "next_offset":
                next_offset = response.next_offset
        if error is not None:
            raise error
        return views, next_offset

    async def _query_offset(
        self, queue: QueueInfo, policy: str, timestamp_ms: int | None = None
    ) -> int:
        request = svc.QueryOffsetRequest(message_queue=queue.to_wire(self.config.namespace))
        if policy == "earliest":
            request.query_offset_policy = pb.QueryOffsetPolicy.BEGINNING
        elif policy == "latest":
            request.query_offset_policy = pb.QueryOffsetPolicy.END
        else:
            request.query_offset_policy = pb.QueryOffsetPolicy.TIMESTAMP
            request.timestamp.FromMilliseconds(int(timestamp_ms or 0))
        response = await self._pool.get(queue.endpoint).call(
            "QueryOffset", request, retry_unavailable=True
        )
        raise_for_status(response.status, "QueryOffset")
        return response.offset

    async def _get_offset(self, queue: QueueInfo) -> int:
        request = svc.GetOffsetRequest(
            group=self._group_pb, message_queue=queue.to_wire(self.config.namespace)
        )
        response = await self._pool.get(queue.endpoint).call(
            "GetOffset", request, retry_unavailable=True
        )
        raise_for_status(response.status, "GetOffset")
        return response.offset

    async def _update_offset(
        self, queue: QueueInfo, offset: int, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        request = svc.UpdateOffsetRequest(
            group=self._group_pb, message_queue=queue.to_wire(self.config.namespace), offset=offset
        )
        response = await self._pool.get(queue.endpoint).call(
            "UpdateOffset", request, retry_unavailable=True, headers=headers
        )
        raise_for_status(response.status, "UpdateOffset")


def _handle(message: MessageView) -> str:
    if not message.receipt_handle:
        raise InvalidReceiptHandle(
            f"message {message.message_id} has no receipt handle (it was pulled by offset, not "
            "received)"
        )
    return message.receipt_handle


async def cancel_and_wait(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until they are gone."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
