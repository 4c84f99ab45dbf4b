"""``RemoteBroker``: the ``Broker`` facade over the internal protocol, for a proxy.

Each operation is one ``Call`` to the broker process (its error raised here
as the same ``HalfmoonError`` subclass), except:

- ``send`` / ``send_nowait`` go through a :class:`SendCoalescer`: concurrent
  sends from many threads share one ``Send`` request. ``send_nowait``
  returns once the request is answered, which the broker does once durable,
  so its ``durable`` future is already complete.
- ``send_async`` (a proxy's front end, on its event loop) goes through a
  :class:`StreamSender`: sends coalesced on the loop, each request one
  message of a long-lived ``SendStream``, no thread involved.
- ``sends_cheaply`` and ``transaction_ends_cheaply`` answer False: every
  operation is a network hop away, so front ends run them on worker threads.
- the ``*_nowait`` transaction calls wait in the broker for durability and
  return a completed ``Written``.
- ``add_arrival_listener``, ``set_check_sender`` and
  ``set_lite_unsubscribe_notifier`` subscribe the Events stream
  (:class:`BrokerEvents`); listeners are called from its thread. A proxy's
  long polls use ``add_watched_arrival_listener`` and ``watch_arrivals``:
  arrivals of the topics they wait on only.
- ``close`` closes the connection only: the broker process persists its
  state when it stops.
- ``epoch``: a broker group's master is reached for one epoch of the group;
  every call and send carries it and the broker refuses them when it is not
  its own (``EPOCH_STALE``, ``MASTER_DEPOSED``: :mod:`halfmoon.cluster.fencing`).

After a broker restart the gRPC channel reconnects by itself and calls wait
for it within their deadline; the Events stream is reopened.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from halfmoon.broker.browse import ScanResult
from halfmoon.broker.config import BrokerConfig
from halfmoon.broker.encoded import encode_for_broker
from halfmoon.broker.facade import (
    PullResult,
    QueueProgress,
    QueueRoute,
    QueueStatus,
    Written,
    end_each,
)
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.groups import GroupConfig, RetryPolicy
from halfmoon.broker.lite import OffsetOption, UnsubscribeNotifier
from halfmoon.broker.message import MessageType, MessageView, OutgoingMessage
from halfmoon.broker.produce import SendResult
from halfmoon.broker.statistics import TrafficRow
from halfmoon.broker.stats import BrokerStatus
from halfmoon.broker.topics import TopicConfig
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions import (
    CheckSender,
    EndRequest,
    EndResult,
    TransactionInfo,
    TransactionStats,
)
from halfmoon.cluster.coalescer import DEFAULT_MAX_IN_FLIGHT, SendCoalescer
from halfmoon.cluster.connection import DEFAULT_TIMEOUT_S, SEND_TIMEOUT_S, BrokerConnection
from halfmoon.cluster.events import BrokerEvents
from halfmoon.cluster.network_hop import NetworkHop
from halfmoon.cluster.send_metrics import observer
from halfmoon.cluster.send_stream import StreamSender
from halfmoon.cluster.wire import BrokerDeadlineExceeded, BrokerUnavailable
from halfmoon.errors import HalfmoonError
from halfmoon.store.api import StoreStats

# A broker found unreachable is avoided this long; then the next call tries it again.
SUSPECT_S = 1.0


def _close_on_its_loop(stream: StreamSender) -> None:
    """Close a send stream from any thread: on its loop, waited for when another thread."""
    loop = stream.loop
    if loop.is_closed() or not loop.is_running():
        return  # nothing runs on it any more: its channel goes with it
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        loop.create_task(stream.close())
        return
    with contextlib.suppress(Exception):  # a loop that stops meanwhile closes it anyway
        asyncio.run_coroutine_threadsafe(stream.close(), loop).result(timeout=5)


def _port(value: object) -> int | None:
    return value if type(value) is int and 0 < value < 65536 else None


def _done() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future


class RemoteBroker(NetworkHop):
    """The broker process at ``target`` (``host:port``), as a ``Broker``."""

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_in_flight_sends: int = DEFAULT_MAX_IN_FLIGHT,
        handshake: bool = True,
        epoch: int | None = None,
    ) -> None:
        self.peer = f"proxy-{uuid.uuid4().hex[:12]}"
        # A broker group's master is reached for one epoch of the group, which every call and
        # send names (halfmoon.cluster.fencing); the pool reconnects when the epoch changes.
        self.epoch = epoch
        self.connection = BrokerConnection(target, peer=self.peer, timeout_s=timeout_s, epoch=epoch)
        try:
            # The version handshake: a peer of another version is refused here, not later.
            hello = self.connection.hello() if handshake else {}
            self.broker_name = str(hello.get("broker", ""))
        except BaseException:
            self.connection.close()
            raise
        self._timeout_s = timeout_s
        self._observe = observer(self.broker_name or target)
        self.sender = SendCoalescer(
            self.connection, max_in_flight=max_in_flight_sends, observer=self._observe
        )
        self._stream_sender: StreamSender | None = None  # made on the first send_async's loop
        self._stream_lock = threading.Lock()
        # The broker's send listener, from its Hello answer (None: the gRPC stream). Looked up
        # again after its connection fails: a restarted broker may listen on another port.
        self._send_port = _port(hello.get("send_port"))
        self._send_port_stale = False
        self._relocating: asyncio.Lock | None = None
        self._closed = False
        self.events = BrokerEvents(self.connection, self.peer)

    def _call(self, operation: str, args: list[Any], kwargs: dict[str, Any] | None = None) -> Any:
        return self.connection.call(operation, args, kwargs)

    # -- lifecycle and settings ----------------------------------------------------------------

    @property
    def config(self) -> BrokerConfig:
        """The broker's settings in force (fetched on every read)."""
        return self._call("config", [])  # type: ignore[no-any-return]

    def writable_within(self, timeout_s: float) -> bool:
        """Whether the broker takes new messages, asked with a short deadline (a send waits)."""
        return bool(self.connection.call("config", [], timeout_s=timeout_s).writable)

    def close(self) -> None:
        """Close the connection (any thread; the send stream is closed on its own loop)."""
        with self._stream_lock:
            self._closed = True
            stream, self._stream_sender = self._stream_sender, None
        if stream is not None:
            _close_on_its_loop(stream)
        self.events.close()
        self.sender.close()
        self.connection.close()

    def add_arrival_listener(self, callback: Callable[[str, int], None]) -> None:
        self.events.add_arrival_listener(callback)

    def add_watched_arrival_listener(self, callback: Callable[[str, int], None]) -> None:
        self.events.add_watched_arrival_listener(callback)

    def watch_arrivals(self, topics: Sequence[str]) -> None:
        self.events.watch(topics)

    def unwatch_arrivals(self, topics: Sequence[str]) -> None:
        self.events.unwatch(topics)

    def set_check_sender(self, sender: CheckSender | None) -> None:
        self.events.set_check_sender(sender)

    def set_lite_unsubscribe_notifier(self, notifier: UnsubscribeNotifier | None) -> None:
        self.events.set_lite_unsubscribe_notifier(notifier)

    # -- produce (coalesced) -----------------------------------------------------------------

    def send(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        if not messages:
            return []
        return self.sender.submit(encode_for_broker(messages)).result()

    def send_nowait(self, messages: Sequence[OutgoingMessage]) -> Written[list[SendResult]]:
        return Written(self.send(messages), _done())

    async def send_async(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        """``send`` from an event loop: the results once durable, no thread involved."""
        if not messages:
            return []
        if self.suspect():
            # Found unreachable (or silent) a moment ago: fail now with a code clients retry,
            # as a blocking call does, rather than queue behind a dead stream.
            raise BrokerUnavailable(f"the broker at {self.connection.target} is unreachable")
        if self._send_port_stale:
            await self._relocate()
        # Plain messages are checked and encoded here, on the proxy, not on the one broker
        # (halfmoon.broker.encoded): the broker then stores their records as they are.
        return await self._stream().send(encode_for_broker(messages))

    async def _relocate(self) -> None:
        """Ask the broker again where its send listener is (its connection failed: the broker
        may have restarted on another port), in a thread (a blocking call); a new port gets a
        new sender, the old one is closed."""
        if self._relocating is None:
            self._relocating = asyncio.Lock()
        async with self._relocating:
            if not self._send_port_stale:
                return  # another send did it meanwhile
            timeout_s = min(self._timeout_s, SEND_TIMEOUT_S)  # as long as a send may wait
            hello = await asyncio.to_thread(self.connection.hello, timeout_s)
            self._send_port_stale = False
            port = _port(hello.get("send_port"))
            if port == self._send_port:
                return
            self._send_port = port
            with self._stream_lock:
                stream, self._stream_sender = self._stream_sender, None
            if stream is not None:
                await stream.close()

    def _stream(self) -> StreamSender:
        with self._stream_lock:
            if self._stream_sender is None:
                if self._closed:
                    raise BrokerUnavailable(f"the connection to {self.connection.target} is closed")
                self._stream_sender = StreamSender(
                    self.connection.target,
                    self.connection.metadata,
                    timeout_s=min(self._timeout_s, SEND_TIMEOUT_S),
                    observer=self._observe,
                    on_failure=self._stream_failed,
                    on_answer=self._stream_answered,
                    send_port=self._send_port,
                )
            return self._stream_sender

    def _stream_failed(self, error: HalfmoonError) -> None:
        if isinstance(error, BrokerUnavailable | BrokerDeadlineExceeded):
            self.connection.failed_at = time.monotonic()
            if self._send_port is not None:
                self._send_port_stale = True

    def _stream_answered(self) -> None:
        self.connection.failed_at = None

    def suspect(self, window_s: float = SUSPECT_S) -> bool:
        """Whether the broker was found unreachable in the last ``window_s`` (and answered
        nothing since): a proxy sends elsewhere and reads from the others meanwhile."""
        return self.connection.suspect(window_s)

    def end_transaction_nowait(
        self,
        topic: str,
        message_id: str,
        transaction_id: str,
        resolution: str,
        source: str,
        producer_group: str | None = None,
    ) -> Written[EndResult]:
        result = self._call(
            "end_transaction_nowait",
            [topic, message_id, transaction_id, resolution, source, producer_group],
        )
        return Written(result, _done())

    def end_transactions_nowait(
        self, requests: Sequence[EndRequest]
    ) -> list[Written[EndResult] | HalfmoonError]:
        return end_each(self, requests)  # no batching across the internal protocol (yet)

    def end_transaction_group_nowait(
        self,
        group_id: str,
        resolution: str,
        source: str = "client",
        consume_actions: int | None = None,
    ) -> Written[int]:
        result = self._call(
            "end_transaction_group_nowait", [group_id, resolution, source, consume_actions]
        )
        return Written(result, _done())

    # -- every other operation: one Call each --------------------------------------------------

    def update_config(self, changes: Mapping[str, Any]) -> BrokerConfig:
        return self._call("update_config", [dict(changes)])

    def tick(self) -> bool:
        return self._call("tick", [])

    def status(self) -> BrokerStatus:
        return self._call("status", [])

    def store_stats(self) -> StoreStats:
        return self._call("store_stats", [])

    def traffic(self, topic: str | None = None, group: str | None = None) -> list[TrafficRow]:
        return self._call("traffic", [topic, group])

    def create_topic(
        self,
        name: str,
        message_type: MessageType = MessageType.NORMAL,
        queue_count: int = 8,
        perm: str = "rw",
        brokers: Sequence[str] = (),
    ) -> TopicConfig:
        return self._call("create_topic", [name, message_type, queue_count, perm, list(brokers)])

    def update_topic(
        self,
        name: str,
        *,
        queue_count: int | None = None,
        perm: str | None = None,
        message_type: MessageType | None = None,
        trace: bool | None = None,
    ) -> TopicConfig:
        return self._call(
            "update_topic",
            [name],
            {
                "queue_count": queue_count,
                "perm": perm,
                "message_type": message_type,
                "trace": trace,
            },
        )

    def delete_topic(self, name: str) -> None:
        self._call("delete_topic", [name])

    def get_topic(self, name: str) -> TopicConfig:
        return self._call("get_topic", [name])

    def find_topic(self, name: str) -> TopicConfig | None:
        return self._call("find_topic", [name])

    def list_topics(self) -> list[TopicConfig]:
        return self._call("list_topics", [])

    def topic_status(self, name: str) -> list[QueueStatus]:
        return self._call("topic_status", [name])

    def route(self, topic: str) -> list[QueueRoute]:
        return self._call("route", [topic])

    def create_group(
        self,
        name: str,
        *,
        fifo: bool = False,
        max_delivery_attempts: int = 17,
        retry_policy: RetryPolicy | None = None,
        consume_from: str | None = None,
        consume_enabled: bool = True,
        broadcast: bool = False,
    ) -> GroupConfig:
        return self._call(
            "create_group",
            [name],
            {
                "fifo": fifo,
                "max_delivery_attempts": max_delivery_attempts,
                "retry_policy": retry_policy,
                "consume_from": consume_from,
                "consume_enabled": consume_enabled,
                "broadcast": broadcast,
            },
        )

    def update_group(self, name: str, **changes: Any) -> GroupConfig:
        return self._call("update_group", [name], changes)

    def delete_group(self, name: str) -> None:
        self._call("delete_group", [name])

    def get_group(self, name: str) -> GroupConfig:
        return self._call("get_group", [name])

    def find_group(self, name: str) -> GroupConfig | None:
        return self._call("find_group", [name])

    def list_groups(self) -> list[GroupConfig]:
        return self._call("list_groups", [])

    def group_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        return self._call("group_progress", [group, topic])

    def subscribe(self, group: str, topic: str) -> None:
        self._call("subscribe", [group, topic])

    def recall(self, topic: str, recall_handle: str) -> str:
        return self._call("recall", [topic, recall_handle])

    def end_transaction(
        self,
        topic: str,
        message_id: str,
        transaction_id: str,
        resolution: str,
        source: str,
        producer_group: str | None = None,
    ) -> TxnState:
        return self._call(
            "end_transaction",
            [topic, message_id, transaction_id, resolution, source, producer_group],
        )

    def end_transaction_group(
        self,
        group_id: str,
        resolution: str,
        source: str = "client",
        consume_actions: int | None = None,
    ) -> int:
        return self._call("end_transaction_group", [group_id, resolution, source, consume_actions])

    def transactional_ack(
        self, transaction_group: str, group: str, topic: str, receipt_handle: str
    ) -> None:
        self._call("transactional_ack", [transaction_group, group, topic, receipt_handle])

    def transactional_reject(
        self,
        transaction_group: str,
        group: str,
        topic: str,
        receipt_handle: str,
        delay_ms: int | None = None,
        dead_letter: bool = False,
    ) -> None:
        self._call(
            "transactional_reject",
            [transaction_group, group, topic, receipt_handle, delay_ms, dead_letter],
        )

    def transactional_offset(
        self,
        transaction_group: str,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        expected: int,
    ) -> None:
        self._call(
            "transactional_offset", [transaction_group, group, topic, queue_id, offset, expected]
        )

    # Broker to broker (a cluster's transaction groups, halfmoon/cluster/txn_groups.py).
    def apply_transaction_group(self, group_id: str, resolution: str, source: str) -> int:
        """A coordinator's decision applied to this broker's members of the group."""
        return int(self._call("apply_transaction_group", [group_id, resolution, source]))

    def transaction_group_decision(self, group_id: str) -> str | None:
        """``commit``, ``rollback`` or None: the decision this broker recorded on the group."""
        answer = self._call("transaction_group_decision", [group_id])
        return None if answer is None else str(answer)

    def list_transactions(
        self, topic: str | None = None, limit: int = 1000
    ) -> list[TransactionInfo]:
        return self._call("list_transactions", [topic, limit])

    def parked_transactions(self, limit: int = 1000) -> list[TransactionInfo]:
        return self._call("parked_transactions", [limit])

    def resume_transaction(self, transaction_id: str) -> TransactionInfo:
        return self._call("resume_transaction", [transaction_id])

    def transaction_stats(self) -> TransactionStats:
        return self._call("transaction_stats", [])

    def receive(
        self,
        group: str,
        topic: str,
        filter: FilterSpec,
        batch_size: int,
        invisible_ms: int,
        client_id: str = "",
        queue_id: int | None = None,
    ) -> list[MessageView]:
        return self._call(
            "receive", [group, topic, filter, batch_size, invisible_ms, client_id, queue_id]
        )

    def next_wakeup_ms(self, group: str, topic: str, client_id: str = "") -> int | None:
        return self._call("next_wakeup_ms", [group, topic, client_id])

    def ack(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None:
        self._call("ack", [group, topic, receipt_handle, lite_topic])

    def change_invisible_duration(
        self,
        group: str,
        topic: str,
        receipt_handle: str,
        invisible_ms: int,
        lite_topic: str | None = None,
    ) -> str:
        return self._call(
            "change_invisible_duration", [group, topic, receipt_handle, invisible_ms, lite_topic]
        )

    def forward_to_dead_letter(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None:
        self._call("forward_to_dead_letter", [group, topic, receipt_handle, lite_topic])

    def sync_lite_subscription(
        self,
        client_id: str,
        group: str,
        topic: str,
        action: str,
        lite_topics: Sequence[str],
        offset: OffsetOption | None = None,
    ) -> list[str]:
        return self._call(
            "sync_lite_subscription", [client_id, group, topic, action, list(lite_topics), offset]
        )

    def list_lite_topics(self, topic: str) -> list[dict[str, object]]:
        return self._call("list_lite_topics", [topic])

    def client_terminated(self, client_id: str) -> None:
        self._call("client_terminated", [client_id])

    def lite_subscriptions(self, topic: str) -> list[dict[str, object]]:
        return self._call("lite_subscriptions", [topic])

    def delete_lite_topic(self, topic: str, lite_topic: str) -> int:
        return self._call("delete_lite_topic", [topic, lite_topic])

    def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        batch_size: int,
        filter: FilterSpec,
    ) -> PullResult:
        return self._call("pull", [group, topic, queue_id, offset, batch_size, filter])

    def bulk_read(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        filter: FilterSpec,
        end_offset: int | None = None,
    ) -> PullResult:
        return self._call(
            "bulk_read",
            [group, topic, queue_id, offset, max_messages, max_bytes, filter, end_offset],
        )

    def get_offset(self, group: str, topic: str, queue_id: int) -> int:
        return self._call("get_offset", [group, topic, queue_id])

    def update_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._call("update_offset", [group, topic, queue_id, offset])

    def query_offset(
        self, topic: str, queue_id: int, policy: str, timestamp: int | None = None
    ) -> int:
        return self._call("query_offset", [topic, queue_id, policy, timestamp])

    def reset_offset(self, group: str, topic: str, timestamp: int) -> dict[int, int]:
        return self._call("reset_offset", [group, topic, timestamp])

    def seek_group(self, group: str, topic: str, offsets: Mapping[int, int]) -> dict[int, int]:
        return self._call("seek_group", [group, topic, dict(offsets)])

    def messages_by_id(self, message_id: str, topic: str | None = None) -> list[MessageView]:
        return self._call("messages_by_id", [message_id, topic])

    def message_trace(self, message_id: str) -> list[dict[str, Any]]:
        return self._call("message_trace", [message_id])  # type: ignore[no-any-return]

    def messages_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, limit: int
    ) -> list[MessageView]:
        return self._call("messages_by_key", [topic, key, begin_ms, end_ms, limit])

    def message_at(self, topic: str, queue_id: int, offset: int) -> MessageView:
        return self._call("message_at", [topic, queue_id, offset])

    def scan(
        self,
        topic: str,
        queue_id: int | None,
        offset: int | None,
        begin_ms: int,
        end_ms: int,
        limit: int,
        filter: FilterSpec,
        with_messages: bool = True,
    ) -> ScanResult:
        return self._call(
            "scan", [topic, queue_id, offset, begin_ms, end_ms, limit, filter, with_messages]
        )
