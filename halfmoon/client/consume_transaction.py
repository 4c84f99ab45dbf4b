"""Consume-transform-produce in one transaction: sends, acks, rejects and offset commits.

::

    async with consumer.transaction(producer) as tx:
        for message in await consumer.receive(10):
            await tx.send(Message("b", transform(message.body)))
            await tx.ack(message)

Commit applies everything together: the sent messages appear and the acked
messages are never delivered to the group again; an exception in the block
rolls everything back (the received messages come back after their invisible
time, their attempt counted). It rides on halfmoon's transaction groups
(docs/transactions.md): each send is a half message of the group, and each
ack, reject or offset commit is the consumer's usual RPC with the header
``x-hm-txn-group`` naming the group. The broker checks each at once (a forged
handle fails at the call) and applies them only when the group commits;
the commit's EndTransaction carries ``x-hm-txn-actions``, how many it
registered, so a broker that restarted meanwhile refuses the commit.

A commit fails with :class:`TransactionFenced` when a received message's
delivery is over (its invisible time ended and another consumer received
it) or a pull consumer's queue was committed by another member since this
one read from it; :class:`TransactionIncomplete` when the broker restarted
during the transaction. Either way the broker rolled the whole group back:
consume again in a new transaction.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Protocol

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.client.connection import ClientConfig
from halfmoon.client.errors import (
    ClientError,
    ConnectionFailed,
    RequestTimeout,
    ServerError,
    TransactionAlreadyEnded,
    TransactionFenced,
    TransactionIncomplete,
    TransactionOutcomeUnknown,
    TransactionRolledBack,
    raise_for_status,
)
from halfmoon.client.message import Message, MessageView, SendReceipt
from halfmoon.client.route import QueueInfo
from halfmoon.client.transaction import GROUP_ID_PREFIX, Transaction, TransactionProducer

log = logging.getLogger("halfmoon.client.consume_transaction")

GROUP_HEADER = "x-hm-txn-group"
ACTIONS_HEADER = "x-hm-txn-actions"
EXPECTED_OFFSET_HEADER = "x-hm-txn-expected-offset"
RETRY_BACKOFF_HEADER = "x-hm-txn-retry-backoff"

Headers = tuple[tuple[str, str], ...]

COMMITTED = "committed"
ROLLED_BACK = "rolled back"


class TransactionalConsumer(Protocol):
    """What a consumer lends a transaction: its RPCs, with halfmoon's headers."""

    group: str

    async def _ack(self, message: MessageView, headers: Headers = ()) -> None: ...

    async def _change_invisible(
        self, message: MessageView, seconds: float, headers: Headers = ()
    ) -> str: ...

    async def _forward_to_dead_letter(
        self, message: MessageView, max_attempts: int, headers: Headers = ()
    ) -> None: ...

    @property
    def _pool(self) -> Any: ...

    @property
    def config(self) -> ClientConfig: ...


class TransactionalPullConsumer(TransactionalConsumer, Protocol):
    def _offsets_to_commit(
        self, offsets: Mapping[QueueInfo, int] | None
    ) -> dict[QueueInfo, int]: ...

    def _expected_offset(self, queue: QueueInfo) -> int: ...

    def _offset_committed(self, queue: QueueInfo, offset: int) -> None: ...

    async def _reload_committed(self, queues: list[QueueInfo]) -> None: ...

    async def _update_offset(
        self, queue: QueueInfo, offset: int, headers: Headers = ()
    ) -> None: ...


class ConsumeTransaction:
    """One transaction group: a consumer's acks, rejects and offset commits, a producer's sends.

    Use it as ``async with`` (commit on success, rollback on an exception) or
    call :meth:`commit` / :meth:`rollback`. One transaction per block; a new
    group id each time.
    """

    def __init__(
        self,
        consumer: TransactionalConsumer,
        producer: TransactionProducer | None = None,
        *,
        group: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """``timeout`` (seconds): undecided this long after its first send, the broker rolls
        the transaction back (None: the producer's ``transaction_timeout``, else the broker's
        default, 60 s)."""
        self.consumer = consumer
        self.producer = producer
        self.group = group or uuid.uuid4().hex
        self._sends = (
            Transaction(producer, self.group, timeout=timeout) if producer is not None else None
        )
        self._actions: dict[tuple[Any, ...], str] = {}
        self._offsets: dict[QueueInfo, int] = {}
        self._topic = ""
        self.ended = False  # a decision was asked for: no new sends or acks
        self.outcome: str | None = None  # COMMITTED or ROLLED_BACK, once the broker said

    @property
    def _headers(self) -> Headers:
        return ((GROUP_HEADER, self.group),)

    def _check_open(self) -> None:
        if self.ended:
            raise ClientError(
                "this transaction has ended; begin a new one", code="TRANSACTION_ENDED"
            )

    async def send(self, message: Message) -> SendReceipt:
        """Send ``message`` as part of the transaction (invisible until the commit)."""
        self._check_open()
        if self._sends is None:
            raise ValueError("this transaction has no producer: pass a TransactionProducer")
        receipt = await self._sends.send(message)
        self._topic = self._topic or message.topic
        return receipt

    async def ack(self, message: MessageView) -> None:
        """Acknowledge ``message`` when the transaction commits (checked now)."""
        self._check_open()
        await self.consumer._ack(message, self._headers)
        self._count(message, "ack")

    async def reject(
        self, message: MessageView, *, delay: float | None = None, dead_letter: bool = False
    ) -> None:
        """On commit, redeliver ``message`` after ``delay`` seconds (None: the group's retry
        backoff for its attempt), or with ``dead_letter`` send it to the group's dead-letter
        topic. Nothing happens on rollback."""
        self._check_open()
        if dead_letter:
            await self.consumer._forward_to_dead_letter(
                message, message.delivery_attempt, self._headers
            )
        else:
            headers = self._headers
            if delay is None:
                headers = (*headers, (RETRY_BACKOFF_HEADER, "1"))
            await self.consumer._change_invisible(message, max(delay or 0.0, 0.0), headers)
        self._count(message, "dead_letter" if dead_letter else "reject")

    async def commit_offsets(self, offsets: Mapping[QueueInfo, int] | None = None) -> None:
        """A pull consumer's committed offsets (default: its positions), set on commit.

        Each queue commits only if the group's committed offset is still the one
        this consumer read from; otherwise the commit is fenced.
        """
        self._check_open()
        consumer = self._pull_consumer()
        for queue, offset in consumer._offsets_to_commit(offsets).items():
            headers = (
                *self._headers,
                (EXPECTED_OFFSET_HEADER, str(consumer._expected_offset(queue))),
            )
            await consumer._update_offset(queue, offset, headers)
            self._actions[("offset", queue.topic, queue.key)] = "offset"
            self._offsets[queue] = offset
            self._topic = self._topic or queue.topic

    def _pull_consumer(self) -> TransactionalPullConsumer:
        if not hasattr(self.consumer, "_expected_offset"):
            raise TypeError("commit_offsets needs a PullConsumer")
        consumer: TransactionalPullConsumer = self.consumer  # type: ignore[assignment]
        return consumer

    def _count(self, message: MessageView, kind: str) -> None:
        self._actions[("delivery", message.topic, message.queue_id, message.queue_offset)] = kind
        self._topic = self._topic or message.topic

    async def commit(self) -> None:
        """Apply every send, ack, reject and offset commit of the transaction, atomically.

        Returns once committed. :class:`TransactionFenced`, :class:`TransactionIncomplete`
        or :class:`TransactionRolledBack`: rolled back instead, nothing applied.
        :class:`TransactionOutcomeUnknown`: no answer (the broker died, the connection
        dropped); call ``commit()`` (or ``rollback()``) again: the retry reaches the broker
        and returns the real outcome. A commit after a known outcome repeats it (returns
        when committed, raises :class:`TransactionRolledBack` when rolled back)."""
        if self.outcome == COMMITTED:
            return
        if self.outcome == ROLLED_BACK:
            raise TransactionRolledBack(
                f"transaction group {self.group!r} was rolled back; it cannot be committed",
                rpc="EndTransaction",
            )
        self.ended = True
        if not self._actions:
            if self._sends is not None:
                await self._decide(COMMITTED, self._sends.commit)
            self.outcome = COMMITTED
            return
        headers = (*self._headers, (ACTIONS_HEADER, str(len(self._actions))))
        try:
            await self._decide(COMMITTED, lambda: self._end("COMMIT", headers))
        except TransactionFenced:
            if self._offsets:
                await self._pull_consumer()._reload_committed(list(self._offsets))
            raise
        if self._offsets:
            consumer = self._pull_consumer()
            for queue, offset in self._offsets.items():
                consumer._offset_committed(queue, offset)

    async def rollback(self) -> None:
        """Apply nothing: sent messages are discarded, received ones come back after their
        invisible time (their attempt counted). After a commit whose outcome was unknown,
        :class:`TransactionAlreadyEnded` says the commit had been applied."""
        if self.outcome == ROLLED_BACK:
            return
        if self.outcome == COMMITTED:
            raise TransactionAlreadyEnded(
                f"transaction group {self.group!r} is already committed; it cannot be rolled back",
                rpc="EndTransaction",
            )
        self.ended = True
        if self._actions or (self._sends is not None and self._sends.receipts):
            await self._decide(ROLLED_BACK, lambda: self._end("ROLLBACK", self._headers))
        self.outcome = ROLLED_BACK
        if self._offsets:
            await self._pull_consumer()._reload_committed(list(self._offsets))

    async def _decide(self, outcome: str, call: Callable[[], Awaitable[None]]) -> None:
        """Run the decision's RPC; record the outcome the broker answered."""
        verb = "commit" if outcome == COMMITTED else "rollback"
        try:
            await call()
        except (TransactionFenced, TransactionIncomplete, TransactionRolledBack):
            self.outcome = ROLLED_BACK
            raise
        except TransactionAlreadyEnded:
            self.outcome = COMMITTED
            raise
        except (ConnectionFailed, RequestTimeout, ServerError) as exc:
            raise TransactionOutcomeUnknown(
                f"the {verb} of transaction group {self.group!r} got no answer ({exc}): it "
                f"may or may not have been applied; call {verb}() again to learn the outcome",
                rpc="EndTransaction",
            ) from exc
        self.outcome = outcome

    async def _end(self, resolution: str, headers: Headers) -> None:
        client: TransactionalConsumer | TransactionProducer = self.producer or self.consumer
        request = svc.EndTransactionRequest(
            topic=pb.Resource(name=self._topic, resource_namespace=client.config.namespace),
            transaction_id=GROUP_ID_PREFIX + self.group,
            resolution=pb.TransactionResolution.Value(resolution),
            source=pb.TransactionSource.SOURCE_CLIENT,
        )
        response = await client._pool.access_point.call("EndTransaction", request, headers=headers)
        raise_for_status(response.status, "EndTransaction")
        if self._sends is not None:
            self._sends.ended = True

    async def __aenter__(self) -> ConsumeTransaction:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.commit()
            return
        try:
            await self.rollback()
        except ClientError as error:  # the broker's own rollback, or its restart, covers it
            log.warning("event=transaction_rollback_failed group=%s error=%s", self.group, error)


__all__ = ["ConsumeTransaction"]
