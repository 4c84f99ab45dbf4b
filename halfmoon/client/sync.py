"""A thin synchronous facade for scripts and Spark executors.

One event loop runs in a daemon thread (shared by every synchronous client of
the process, started on first use); each blocking method submits the async
client's coroutine to it and waits for the result. The async clients stay
the single implementation: these classes only translate calls.

    with SyncProducer("127.0.0.1:8081") as producer:
        producer.send(Message("orders", b"..."))

Push consumer listeners run on the background loop's worker threads, as
with the async client.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, Generic, TypeVar, cast

from halfmoon.client.client import BaseClient
from halfmoon.client.connection import ClientConfig
from halfmoon.client.consume_transaction import ConsumeTransaction
from halfmoon.client.message import Message, MessageView, SendReceipt
from halfmoon.client.producer import Producer
from halfmoon.client.pull_consumer import PullConsumer
from halfmoon.client.push_consumer import MessageListener, PushConsumer
from halfmoon.client.route import QueueInfo
from halfmoon.client.selector import MessageSelector
from halfmoon.client.simple_consumer import SimpleConsumer
from halfmoon.client.transaction import (
    Transaction,
    TransactionListener,
    TransactionProducer,
    TransactionResolution,
    TransactionSendResult,
)

T = TypeVar("T")
ClientT = TypeVar("ClientT", bound=BaseClient)

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def background_loop() -> asyncio.AbstractEventLoop:
    """The process-wide loop the synchronous clients run on (started on first use)."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=run, name="halfmoon-client-loop", daemon=True).start()
            ready.wait()
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the background loop and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, background_loop()).result(timeout)


def _build(factory: Any, *args: Any, **kwargs: Any) -> Any:
    # Clients create loop-bound objects (events, semaphores): build them on the loop.
    async def make() -> Any:
        return factory(*args, **kwargs)

    return run_sync(make())


class _SyncClient(Generic[ClientT]):
    """Holds the async client it translates for."""

    def __init__(self, client: ClientT) -> None:
        self._client = client

    def start(self) -> None:
        """Connect (see the async client's ``start``)."""
        run_sync(self._client.start())

    def close(self) -> None:
        """Shut down cleanly (see the async client's ``close``)."""
        run_sync(self._client.close())

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def client(self) -> ClientT:
        """The underlying async client."""
        return self._client


class SyncProducer(_SyncClient[Producer]):
    """Blocking :class:`~halfmoon.client.Producer`."""

    def __init__(self, config: ClientConfig | str, **options: Any) -> None:
        super().__init__(_build(Producer, config, **options))

    def send(self, message: Message, *, timeout: float | None = None) -> SendReceipt:
        """Send one message and return its receipt."""
        return run_sync(self._client.send(message, timeout=timeout))

    def send_batch(self, messages: Sequence[Message]) -> list[SendReceipt]:
        """Send a batch (split under 4 MiB per request) and return the receipts in order."""
        return run_sync(self._client.send_batch(messages))

    def send_oneway(self, message: Message) -> None:
        """Send without waiting for the answer."""

        async def oneway() -> None:
            self._client.send_oneway(message)

        run_sync(oneway())


class SyncTransactionProducer(SyncProducer):
    """Blocking :class:`~halfmoon.client.transaction.TransactionProducer`."""

    def __init__(
        self,
        config: ClientConfig | str,
        producer_group: str,
        listener: TransactionListener | None = None,
        **options: Any,
    ) -> None:
        # SyncProducer's __init__ would build a plain Producer: hold a transactional one.
        _SyncClient.__init__(
            self, _build(TransactionProducer, config, producer_group, listener, **options)
        )

    @property
    def client(self) -> TransactionProducer:
        """The underlying async client."""
        return cast(TransactionProducer, self._client)  # the one __init__ built

    def send_message_in_transaction(
        self, message: Message, arg: Any = None
    ) -> TransactionSendResult:
        """Half message, local transaction, decision (see the async method)."""
        return run_sync(self.client.send_message_in_transaction(message, arg))

    def begin(self, *, group: str | None = None, timeout: float | None = None) -> Transaction:
        """A transaction; drive it with :meth:`send_in`, :meth:`commit` and :meth:`rollback`."""
        return self.client.begin(group=group, timeout=timeout)

    def send_in(self, transaction: Transaction, message: Message) -> SendReceipt:
        return run_sync(transaction.send(message))

    def commit(self, transaction: Transaction) -> None:
        run_sync(transaction.commit())

    def rollback(self, transaction: Transaction) -> None:
        run_sync(transaction.rollback())

    def end_transaction(
        self, topic: str, message_id: str, transaction_id: str, resolution: TransactionResolution
    ) -> None:
        run_sync(self.client.end_transaction(topic, message_id, transaction_id, resolution))


class SyncConsumeTransaction:
    """Blocking :class:`~halfmoon.client.consume_transaction.ConsumeTransaction`.

    ``with consumer.transaction(producer) as tx: tx.send(m); tx.ack(received)``:
    commits when the block ends, rolls back on an exception.
    """

    def __init__(self, transaction: ConsumeTransaction) -> None:
        self.transaction = transaction

    @property
    def group(self) -> str:
        return self.transaction.group

    def send(self, message: Message) -> SendReceipt:
        return run_sync(self.transaction.send(message))

    def ack(self, message: MessageView) -> None:
        run_sync(self.transaction.ack(message))

    def reject(
        self, message: MessageView, *, delay: float | None = None, dead_letter: bool = False
    ) -> None:
        run_sync(self.transaction.reject(message, delay=delay, dead_letter=dead_letter))

    def commit_offsets(self, offsets: Mapping[QueueInfo, int] | None = None) -> None:
        run_sync(self.transaction.commit_offsets(offsets))

    def commit(self) -> None:
        run_sync(self.transaction.commit())

    def rollback(self) -> None:
        run_sync(self.transaction.rollback())

    def __enter__(self) -> SyncConsumeTransaction:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        run_sync(self.transaction.__aexit__(exc_type, None, None))


def _producer_of(producer: SyncTransactionProducer | None) -> TransactionProducer | None:
    return producer.client if producer is not None else None


class SyncSimpleConsumer(_SyncClient[SimpleConsumer]):
    """Blocking :class:`~halfmoon.client.SimpleConsumer`."""

    def __init__(
        self,
        config: ClientConfig | str,
        group: str,
        subscriptions: Mapping[str, MessageSelector] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(_build(SimpleConsumer, config, group, subscriptions, **options))

    def receive(
        self, max_messages: int = 16, invisible_duration: float = 30.0, *, wait: float | None = None
    ) -> list[MessageView]:
        """Up to ``max_messages`` messages (see the async method)."""
        return run_sync(self._client.receive(max_messages, invisible_duration, wait=wait))

    def ack(self, message: MessageView) -> None:
        run_sync(self._client.ack(message))

    def change_invisible_duration(
        self, message: MessageView, invisible_duration: float
    ) -> MessageView:
        return run_sync(self._client.change_invisible_duration(message, invisible_duration))

    def transaction(
        self,
        producer: SyncTransactionProducer | None = None,
        *,
        group: str | None = None,
        timeout: float | None = None,
    ) -> SyncConsumeTransaction:
        """Acks and rejects of this consumer and ``producer``'s sends, committed together."""
        return SyncConsumeTransaction(
            self._client.transaction(_producer_of(producer), group=group, timeout=timeout)
        )


class SyncPullConsumer(_SyncClient[PullConsumer]):
    """Blocking :class:`~halfmoon.client.pull_consumer.PullConsumer` (Spark executors read through
    this)."""

    def __init__(
        self,
        config: ClientConfig | str,
        group: str,
        subscriptions: Mapping[str, MessageSelector] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(_build(PullConsumer, config, group, subscriptions, **options))

    def fetch_queues(self, topic: str) -> list[QueueInfo]:
        return run_sync(self._client.fetch_queues(topic))

    def assign(self, queues: Sequence[QueueInfo]) -> None:
        run_sync(self._client.assign(queues))

    def assignment(self) -> list[QueueInfo]:
        return self._client.assignment()

    def poll(self, timeout: float = 1.0) -> list[MessageView]:
        return run_sync(self._client.poll(timeout))

    def seek(self, queue: QueueInfo, offset: int) -> None:
        run_sync(self._client.seek(queue, offset))

    def position(self, queue: QueueInfo) -> int:
        return self._client.position(queue)

    def commit(self, offsets: Mapping[QueueInfo, int] | None = None) -> None:
        run_sync(self._client.commit(offsets))

    def committed(self, queue: QueueInfo) -> int | None:
        return run_sync(self._client.committed(queue))

    def transaction(
        self,
        producer: SyncTransactionProducer | None = None,
        *,
        group: str | None = None,
        timeout: float | None = None,
    ) -> SyncConsumeTransaction:
        """Offset commits of this consumer and ``producer``'s sends, committed together."""
        return SyncConsumeTransaction(
            self._client.transaction(_producer_of(producer), group=group, timeout=timeout)
        )


class SyncPushConsumer(_SyncClient[PushConsumer]):
    """:class:`~halfmoon.client.PushConsumer` started and stopped from synchronous code."""

    def __init__(
        self,
        config: ClientConfig | str,
        group: str,
        subscriptions: Mapping[str, MessageSelector],
        listener: MessageListener,
        **options: Any,
    ) -> None:
        super().__init__(_build(PushConsumer, config, group, subscriptions, listener, **options))
