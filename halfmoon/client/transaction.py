"""Transactional messages: half message, local transaction, decision; server checks; groups.

``send_message_in_transaction(message, arg)`` is RocketMQ's two-phase send:
the half message is stored (invisible), ``listener.execute_local_transaction``
runs, and its answer ends the transaction (COMMIT publishes the message,
ROLLBACK discards it, UNKNOWN leaves it to the server's check). When the
decision never arrives, the server asks a live producer of the same producer
group (``RecoverOrphanedTransactionCommand`` on the telemetry stream);
``listener.check_local_transaction`` answers it, on a bounded pool of
``check_workers`` concurrent checks so a burst of checks cannot swamp the
application.

Lower level: ``begin()`` returns a :class:`Transaction` to send several half
messages and ``commit()`` / ``rollback()`` them. ``begin(group=...)`` (or
``begin_group()``) makes a *transaction group*: every half message carries
the group id and one EndTransaction (transaction id ``hm-group:<id>``) decides
them all atomically, whatever topics they went to.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.client.connection import ClientConfig
from halfmoon.client.errors import ClientError, raise_for_status
from halfmoon.client.message import Message, MessageView, SendReceipt, view_of
from halfmoon.client.producer import Producer

log = logging.getLogger("halfmoon.client.transaction")

PROPERTY_TRANSACTION_GROUP = "__HM_TXN_GROUP"
PROPERTY_TRANSACTION_TIMEOUT = "__HM_TXN_TIMEOUT_MS"
# A Spark micro-batch's group stays open while its executors write: it asks for the broker's
# default ceiling (transaction.group_timeout_max_ms), 15 minutes, as Kafka's sink must.
BATCH_TRANSACTION_TIMEOUT_MS = 900_000
GROUP_ID_PREFIX = "hm-group:"


def _timeout_ms(seconds: float) -> int:
    """A transaction timeout in whole milliseconds (at least 1)."""
    if not seconds > 0:
        raise ValueError(f"a transaction timeout must be positive seconds, got {seconds!r}")
    return max(1, round(seconds * 1000))


class TransactionResolution(enum.Enum):
    """A local transaction's outcome."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


class TransactionListener(Protocol):
    """The two questions a transactional producer answers (sync or async methods)."""

    def execute_local_transaction(
        self, message: Message, arg: Any
    ) -> TransactionResolution | Awaitable[TransactionResolution]:
        """Run the local transaction for the half message just stored; say how it ended."""
        ...

    def check_local_transaction(
        self, message: MessageView
    ) -> TransactionResolution | Awaitable[TransactionResolution]:
        """The server asks about a transaction left undecided: how did it end?"""
        ...


_WIRE_RESOLUTION = {
    TransactionResolution.COMMIT: pb.TransactionResolution.COMMIT,
    TransactionResolution.ROLLBACK: pb.TransactionResolution.ROLLBACK,
}


@dataclass(frozen=True)
class TransactionSendResult:
    """The half message's receipt and what the local transaction decided."""

    receipt: SendReceipt
    resolution: TransactionResolution


@dataclass
class Transaction:
    """Half messages sent together and decided together (see :meth:`TransactionProducer.begin`)."""

    producer: TransactionProducer
    group: str | None = None
    receipts: list[tuple[str, SendReceipt]] = field(default_factory=list)
    ended: bool = False
    # A group undecided this long after its first send is rolled back by the broker (None:
    # the producer's ``transaction_timeout``, else the broker's default, 60 s).
    timeout: float | None = None

    async def send(self, message: Message) -> SendReceipt:
        """Store ``message`` as a half message of this transaction (invisible until commit)."""
        if self.ended:
            raise ClientError(
                "this transaction has ended; begin a new one", code="TRANSACTION_ENDED"
            )
        if self.group is not None:
            message.properties[PROPERTY_TRANSACTION_GROUP] = self.group
            timeout = (
                self.timeout if self.timeout is not None else self.producer.transaction_timeout
            )
            if timeout is not None:
                message.properties[PROPERTY_TRANSACTION_TIMEOUT] = str(_timeout_ms(timeout))
        receipt = await self.producer.send_half(message)
        self.receipts.append((message.topic, receipt))
        return receipt

    async def commit(self) -> None:
        """Publish every half message of the transaction."""
        await self._end(TransactionResolution.COMMIT)

    async def rollback(self) -> None:
        """Discard every half message of the transaction."""
        await self._end(TransactionResolution.ROLLBACK)

    async def _end(self, resolution: TransactionResolution) -> None:
        if self.ended:
            return
        if self.group is not None:
            if self.receipts:
                topic = self.receipts[0][0]
                await self.producer.end_transaction(
                    topic, "", GROUP_ID_PREFIX + self.group, resolution
                )
        else:
            await asyncio.gather(
                *(
                    self.producer.end_transaction(topic, r.message_id, r.transaction_id, resolution)
                    for topic, r in self.receipts
                )
            )
        self.ended = True


class TransactionProducer(Producer):
    """A producer of one producer group that sends transactional messages."""

    def __init__(
        self,
        config: ClientConfig | str,
        producer_group: str,
        listener: TransactionListener | None = None,
        *,
        check_workers: int = 4,
        transaction_timeout: float | None = None,
        **options: Any,
    ) -> None:
        """``transaction_timeout`` (seconds): a transaction group of this producer undecided
        this long after its first send is rolled back by the broker (None: the broker's
        ``transaction.group_timeout_ms``, 60 s by default); Kafka's transaction.timeout.ms."""
        super().__init__(config, **options)
        if not producer_group:
            raise ValueError(
                "a transactional producer needs a producer group (the server checks its members)"
            )
        if transaction_timeout is not None:
            _timeout_ms(transaction_timeout)
        self.transaction_timeout = transaction_timeout
        self.producer_group = producer_group
        self.listener = listener
        # Checks wait here for one of ``check_workers`` worker tasks (started at the first
        # check): a burst of thousands costs a queue entry each, not a task and a semaphore.
        self._check_workers = max(check_workers, 1)
        self._check_queue: asyncio.Queue[tuple[MessageView, str]] = asyncio.Queue()
        self._workers: list[asyncio.Task[None]] = []
        self._held: set[str] = set()  # transaction ids of the checks queued or being answered
        self.checks_received = 0
        self.checks_answered = 0

    @property
    def checks_held(self) -> int:
        """Checks received and not answered yet (queued for a worker, or being answered)."""
        return len(self._held)

    def _group_resource(self) -> pb.Resource | None:
        # Heartbeats name the producer group: the server routes checks by it.
        return pb.Resource(name=self.producer_group, resource_namespace=self.config.namespace)

    async def send_half(self, message: Message) -> SendReceipt:
        """Store ``message`` as a half message (invisible until its transaction ends)."""
        self._check_open()
        receipts = await self._send(message.topic, [self._wire(message, transactional=True)])
        return receipts[0]

    async def send_message_in_transaction(
        self, message: Message, arg: Any = None
    ) -> TransactionSendResult:
        """Half message, then ``listener.execute_local_transaction(message, arg)``, then its
        decision.

        An exception in the local transaction rolls the message back and is re-raised.
        """
        if self.listener is None:
            raise ValueError("send_message_in_transaction needs a TransactionListener")
        receipt = await self.send_half(message)
        try:
            resolution = await _call(self.listener.execute_local_transaction, message, arg)
        except Exception:
            await self.end_transaction(
                message.topic,
                receipt.message_id,
                receipt.transaction_id,
                TransactionResolution.ROLLBACK,
            )
            raise
        if resolution is not TransactionResolution.UNKNOWN:
            await self.end_transaction(
                message.topic, receipt.message_id, receipt.transaction_id, resolution
            )
        return TransactionSendResult(receipt, resolution)

    def begin(self, *, group: str | None = None, timeout: float | None = None) -> Transaction:
        """A transaction to send half messages into; with ``group``, one atomic group decision,
        rolled back by the broker when undecided ``timeout`` seconds after its first send
        (None: the producer's ``transaction_timeout``)."""
        self._check_open()
        if timeout is not None:
            _timeout_ms(timeout)
        return Transaction(self, group, timeout=timeout)

    def begin_group(self) -> Transaction:
        """A transaction group with a fresh id: many messages, one atomic commit."""
        return self.begin(group=uuid.uuid4().hex)

    async def end_transaction(
        self,
        topic: str,
        message_id: str,
        transaction_id: str,
        resolution: TransactionResolution,
        *,
        from_check: bool = False,
    ) -> None:
        """Commit or roll back one transaction (UNKNOWN does nothing: the server will check)."""
        if resolution is TransactionResolution.UNKNOWN:
            return
        request = svc.EndTransactionRequest(
            topic=pb.Resource(name=topic, resource_namespace=self.config.namespace),
            message_id=message_id,
            transaction_id=transaction_id,
            resolution=_WIRE_RESOLUTION[resolution],
            source=pb.TransactionSource.SOURCE_SERVER_CHECK
            if from_check
            else pb.TransactionSource.SOURCE_CLIENT,
        )
        response = await self._pool.access_point.call("EndTransaction", request)
        raise_for_status(response.status, "EndTransaction")

    async def _on_command(self, endpoint: str, command: svc.TelemetryCommand) -> None:
        if command.WhichOneof("command") != "recover_orphaned_transaction_command":
            await super()._on_command(endpoint, command)
            return
        recover = command.recover_orphaned_transaction_command
        self.checks_received += 1
        transaction_id = recover.transaction_id
        if transaction_id in self._held:
            return  # asked again before we answered: the answer on its way serves both
        self._held.add(transaction_id)
        self._check_queue.put_nowait((view_of(recover.message, endpoint), transaction_id))
        if not self._workers:
            self._workers = [
                asyncio.create_task(self._check_worker(), name=f"halfmoon-check-{i}")
                for i in range(self._check_workers)
            ]

    async def _check_worker(self) -> None:
        queue = self._check_queue
        while True:
            message, transaction_id = await queue.get()
            try:
                await self._answer_check(message, transaction_id)
            finally:
                self._held.discard(transaction_id)
                queue.task_done()

    async def _on_closing(self) -> None:
        # Answer the checks already received (bounded), then stop the workers.
        if self._workers:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._check_queue.join(), self.config.request_timeout)
            for task in self._workers:
                task.cancel()
            await asyncio.gather(*self._workers, return_exceptions=True)
            self._workers = []
        await super()._on_closing()

    async def _answer_check(self, message: MessageView, transaction_id: str) -> None:
        if self.listener is None:
            log.warning(
                "event=check_unanswered transaction_id=%s reason=no_listener", transaction_id
            )
            return
        try:
            resolution = await _call(self.listener.check_local_transaction, message)
            await self.end_transaction(
                message.topic, message.message_id, transaction_id, resolution, from_check=True
            )
            self.checks_answered += 1
        except Exception as exc:  # noqa: BLE001 - the server checks again later
            log.warning("event=check_failed transaction_id=%s error=%r", transaction_id, exc)


# Listener methods (their functions) -> async? ``inspect.iscoroutinefunction`` per check shows.
_IS_ASYNC: dict[object, bool] = {}


def _is_async(fn: Any) -> bool:
    key = getattr(fn, "__func__", fn)
    try:
        found = _IS_ASYNC.get(key)
    except TypeError:  # an unhashable callable
        return inspect.iscoroutinefunction(fn)
    if found is None:
        if len(_IS_ASYNC) >= 1024:
            _IS_ASYNC.clear()
        found = _IS_ASYNC[key] = inspect.iscoroutinefunction(fn)
    return found


async def _call(fn: Any, *args: Any) -> TransactionResolution:
    if _is_async(fn):
        result = await fn(*args)
    else:
        result = await asyncio.to_thread(fn, *args)
        if inspect.isawaitable(result):
            result = await result
    if not isinstance(result, TransactionResolution):
        raise TypeError(
            f"a transaction listener must return a TransactionResolution, not {result!r}"
        )
    return result
