"""``RemoteBroker``: the ``Broker`` facade over the internal protocol, for a proxy.

Each operation is one ``Call`` to the broker process (its error raised here
as the same ``HalfmoonError`` subclass), made from the facade's declaration
(:func:`halfmoon.cluster.internal.forwards.forward`: its signature and docstring, the
class still checked against the protocol), except what is written out here:

- sends take one route, the broker's send listener (its port from the
  ``Hello`` answer): ``send_async`` (on a proxy's event loop) through a
  :class:`StreamSender` on that loop, concurrent sends coalesced into one
  request on one long-lived connection, no thread involved; ``send`` (a
  blocking caller, off any loop) the same through a :class:`StreamSender` on
  this object's own send loop (:class:`SendLoop`, a thread started at the
  first such send), so the sends of many threads coalesce there too.
- ``send_nowait`` answers a ``Pending`` that is one or the other: awaited on
  an event loop, ``send_async``; written off one, ``send``.
  ``send_fanout_nowait`` is a ``Pending`` of ``send_fanout``.
- the ``*_nowait`` transaction calls answer a ``Pending`` whose write is the
  call, answered by the broker once durable
  (:func:`~halfmoon.cluster.internal.forwards.forward_pending`): a front end
  awaits it on a worker thread.
- ``add_arrival_listener``, ``set_check_sender`` and
  ``set_lite_unsubscribe_notifier`` subscribe the Events stream
  (:class:`BrokerEvents`); listeners are called from its thread. A proxy's
  long polls use ``add_watched_arrival_listener`` and ``watch_arrivals``:
  arrivals of the topics they wait on only.
- ``close`` closes the connection only: the broker process persists its
  state when it stops.
- ``epoch``: a broker group's master is reached for one epoch of the group;
  every call and send carries it and the broker refuses them when it is not
  its own (``EPOCH_STALE``, ``MASTER_DEPOSED``: :mod:`halfmoon.cluster.internal.fencing`).

After a broker restart the gRPC channel reconnects by itself and calls wait
for it within their deadline; the Events stream is reopened.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from typing import Any, TypeVar

from halfmoon.broker.config import BrokerConfig
from halfmoon.broker.encoded import encode_for_broker
from halfmoon.broker.facade import (
    Administration,
    Answer,
    Browsing,
    Messaging,
    Transactions,
    end_each,
)
from halfmoon.broker.facade_types import Pending, deferred
from halfmoon.broker.lite import UnsubscribeNotifier
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.broker.produce import SendResult, fanout_copies
from halfmoon.broker.transactions import (
    CheckSender,
    EndRequest,
    EndResult,
)
from halfmoon.broker.transactions.resolutions import DecisionSource, Resolution
from halfmoon.cluster.internal import network_hop
from halfmoon.cluster.internal.connection import DEFAULT_TIMEOUT_S, SEND_TIMEOUT_S, BrokerConnection
from halfmoon.cluster.internal.events import BrokerEvents
from halfmoon.cluster.internal.forwards import forward, forward_pending
from halfmoon.cluster.internal.internal_tls import PLAINTEXT, InternalTls
from halfmoon.cluster.internal.send.metrics import observer
from halfmoon.cluster.internal.send.stream import DEFAULT_STREAM_IN_FLIGHT, StreamSender
from halfmoon.cluster.internal.wire import BrokerDeadlineExceeded, BrokerUnavailable
from halfmoon.errors import HalfmoonError

# A broker found unreachable is avoided this long; then the next call tries it again.
SUSPECT_S = 1.0

T = TypeVar("T")

_closing: set[asyncio.Task[None]] = set()  # senders closing on the caller's own loop


def _close_on_its_loop(stream: StreamSender, *, wait: bool) -> None:
    """Close a sender from any thread, on its own loop: waited for when ``wait`` and the
    caller is on another thread (never from a loop: that loop would stall meanwhile)."""
    loop = stream.loop
    if loop.is_closed() or not loop.is_running():
        return  # nothing runs on it any more: its connection goes with it
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        closing_here = loop.create_task(stream.close())
        _closing.add(closing_here)  # held until it ends: the loop's references are weak
        closing_here.add_done_callback(_closing.discard)
        return
    closing = asyncio.run_coroutine_threadsafe(stream.close(), loop)
    if wait and running is None:
        with contextlib.suppress(Exception):  # a loop that stops meanwhile closes it anyway
            closing.result(timeout=5)


class SendLoop:
    """An event loop on a thread of its own, for sends made off any loop: a blocking
    ``send`` runs there, so the one send route (a :class:`StreamSender`) serves threads too."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """``work`` run on the send loop; its result (or error) for the calling thread."""
        try:
            return asyncio.run_coroutine_threadsafe(work, self.loop).result()
        except concurrent.futures.CancelledError:  # close() cancelled it
            raise BrokerUnavailable("the connection to the broker was closed") from None

    def close(self) -> None:
        """Cancel what still runs on the loop (its callers hear ``BROKER_UNAVAILABLE``), stop
        it and wait for the thread."""
        if self.loop.is_closed():
            return
        with contextlib.suppress(Exception):  # a loop already stopping ends its tasks anyway
            asyncio.run_coroutine_threadsafe(_cancel_others(), self.loop).result(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


async def _cancel_others() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _port(value: object) -> int | None:
    return value if type(value) is int and 0 < value < 65536 else None


class RemoteBroker:
    """The broker process at ``target`` (``host:port``), as a ``Broker``."""

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_in_flight_sends: int = DEFAULT_STREAM_IN_FLIGHT,
        handshake: bool = True,
        epoch: int | None = None,
        tls: InternalTls = PLAINTEXT,
    ) -> None:
        self.peer = f"proxy-{uuid.uuid4().hex[:12]}"
        # A broker group's master is reached for one epoch of the group, which every call and
        # send names (halfmoon.cluster.internal.fencing); the pool reconnects when the epoch
        # changes.
        self.epoch = epoch
        self.connection = BrokerConnection(
            target, peer=self.peer, timeout_s=timeout_s, epoch=epoch, tls=tls
        )
        try:
            # The version handshake: a peer of another version is refused here, not later.
            hello = self.connection.hello() if handshake else {}
            self.broker_name = str(hello.get("broker", ""))
        except BaseException:
            self.connection.close()
            raise
        self._timeout_s = timeout_s
        self._observe = observer(self.broker_name or target)
        self._max_in_flight_sends = max_in_flight_sends
        # One sender per event loop sends are made on: the front end's, and this object's own
        # send loop for blocking callers (made at the first such send).
        self._senders: dict[asyncio.AbstractEventLoop, StreamSender] = {}
        self._send_loop: SendLoop | None = None
        self._senders_lock = threading.Lock()
        # The broker's send listener, from its Hello answer. Looked up again after its
        # connection fails (a restarted broker may listen on another port), and before the
        # first send when the handshake was skipped.
        self._send_port = _port(hello.get("send_port"))
        self._send_port_stale = self._send_port is None
        self._relocating = threading.Lock()
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
        """Close the connection (any thread; each sender is closed on its own loop)."""
        with self._senders_lock:
            self._closed = True
            senders = list(self._senders.values())
            self._senders.clear()
            send_loop, self._send_loop = self._send_loop, None
        for sender in senders:
            _close_on_its_loop(sender, wait=True)
        if send_loop is not None:
            send_loop.close()
        self.events.close()
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
        """``send_async`` for a blocking caller, run on this object's send loop."""
        if not messages:
            return []
        with self._senders_lock:
            if self._closed:
                raise BrokerUnavailable(f"the connection to {self.connection.target} is closed")
            if self._send_loop is None:
                self._send_loop = SendLoop(f"halfmoon-send-{self.broker_name or 'broker'}")
            send_loop = self._send_loop
        return send_loop.run(self.send_async(messages))

    def send_fanout(self, message: OutgoingMessage, others: Sequence[str]) -> list[SendResult]:
        copies = fanout_copies(message, others)  # a topic named twice is refused here
        if not others or message.message_type is MessageType.TRANSACTION:
            # Half messages go by the send listener, which remembers the peer they came
            # through (their checks are asked there first); they are one per topic anyway.
            return self.send(copies)
        # One call: the broker stores the message once for all its topics (one record).
        return self._call("send_fanout", [copies[0], list(others)])  # type: ignore[no-any-return]

    def send_nowait(self, messages: Sequence[OutgoingMessage]) -> Pending[list[SendResult]]:
        """A send made when its answer is asked for: on an event loop :meth:`send_async`,
        off one :meth:`send` (the same route, from this object's send loop)."""
        return Pending.of_durable(partial(self.send, messages), partial(self.send_async, messages))

    send_fanout_nowait = deferred(send_fanout)

    async def send_async(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        """``send`` from an event loop: the results once durable, no thread involved."""
        if not messages:
            return []
        if self.suspect():
            # Found unreachable (or silent) a moment ago: fail now with a code clients retry,
            # as a blocking call does, rather than queue behind a dead connection.
            raise BrokerUnavailable(f"the broker at {self.connection.target} is unreachable")
        if self._send_port_stale:
            await self._relocate()
        # Plain messages are checked and encoded here, on the proxy, not on the one broker
        # (halfmoon.broker.encoded): the broker then stores their records as they are.
        return await self._sender().send(encode_for_broker(messages))

    async def _relocate(self) -> None:
        """Ask the broker (again) where its send listener is, in a thread (a blocking call):
        its connection failed, and the broker may have restarted on another port. A new port
        closes every loop's sender; the next sends open new ones."""
        replaced = await asyncio.to_thread(self._look_up_send_port)
        for sender in replaced:
            _close_on_its_loop(sender, wait=False)

    def _look_up_send_port(self) -> list[StreamSender]:
        with self._relocating:
            if not self._send_port_stale:
                return []  # another send did it meanwhile
            timeout_s = min(self._timeout_s, SEND_TIMEOUT_S)  # as long as a send may wait
            port = _port(self.connection.hello(timeout_s).get("send_port"))
            if port is None:
                raise BrokerUnavailable(
                    f"the broker at {self.connection.target} announces no send listener"
                )
            self._send_port_stale = False
            if port == self._send_port:
                return []
            self._send_port = port
            with self._senders_lock:
                replaced = list(self._senders.values())
                self._senders.clear()
            return replaced

    def _sender(self) -> StreamSender:
        """The sender of the running loop (made at its first send)."""
        loop = asyncio.get_running_loop()
        with self._senders_lock:
            sender = self._senders.get(loop)
            if sender is None:
                if self._closed:
                    raise BrokerUnavailable(f"the connection to {self.connection.target} is closed")
                assert self._send_port is not None  # looked up before the first send
                for gone in [other for other in self._senders if other.is_closed()]:
                    del self._senders[gone]  # an event loop that ended (a test's, a worker's)
                sender = self._senders[loop] = StreamSender(
                    self.connection.target,
                    self.connection.metadata,
                    send_port=self._send_port,
                    timeout_s=min(self._timeout_s, SEND_TIMEOUT_S),
                    max_in_flight=self._max_in_flight_sends,
                    observer=self._observe,
                    on_failure=self._send_failed,
                    on_answer=self._send_answered,
                    tls=self.connection.tls,
                )
            return sender

    def _send_failed(self, error: HalfmoonError) -> None:
        if isinstance(error, BrokerUnavailable | BrokerDeadlineExceeded):
            self.connection.failed_at = time.monotonic()
            self._send_port_stale = True

    def _send_answered(self) -> None:
        self.connection.failed_at = None

    def suspect(self, window_s: float = SUSPECT_S) -> bool:
        """Whether the broker was found unreachable in the last ``window_s`` (and answered
        nothing since): a proxy sends elsewhere and reads from the others meanwhile."""
        return self.connection.suspect(window_s)

    def end_transactions_nowait(
        self, requests: Sequence[EndRequest]
    ) -> list[Answer[EndResult] | HalfmoonError]:
        return end_each(self, requests)  # no batching across the internal protocol (yet)

    # -- the event loop's fast paths: declined, every call crosses the network -------------

    ack_nowait = network_hop.ack_nowait
    receive_nowait = network_hop.receive_nowait

    # -- every other operation: one Call each, as the facade declares it ----------------------

    update_config = forward(Administration.update_config)
    tick = forward(Administration.tick)
    status = forward(Administration.status)
    store_stats = forward(Administration.store_stats)
    counted_metrics = forward(Administration.counted_metrics)
    traffic = forward(Administration.traffic)
    traffic_history = forward(Administration.traffic_history)
    create_topic = forward(Administration.create_topic)
    update_topic = forward(Administration.update_topic)
    delete_topic = forward(Administration.delete_topic)
    get_topic = forward(Administration.get_topic)
    find_topic = forward(Administration.find_topic)
    list_topics = forward(Administration.list_topics)
    topic_status = forward(Administration.topic_status)
    route = forward(Administration.route)
    create_group = forward(Administration.create_group)
    update_group = forward(Administration.update_group)
    delete_group = forward(Administration.delete_group)
    get_group = forward(Administration.get_group)
    find_group = forward(Administration.find_group)
    list_groups = forward(Administration.list_groups)
    group_progress = forward(Administration.group_progress)
    subscribe = forward(Administration.subscribe)

    recall = forward(Messaging.recall)
    receive = forward(Messaging.receive)
    next_wakeup_ms = forward(Messaging.next_wakeup_ms)
    ack = forward(Messaging.ack)
    change_invisible_duration = forward(Messaging.change_invisible_duration)
    forward_to_dead_letter = forward(Messaging.forward_to_dead_letter)
    sync_lite_subscription = forward(Messaging.sync_lite_subscription)
    list_lite_topics = forward(Messaging.list_lite_topics)
    client_terminated = forward(Messaging.client_terminated)
    lite_subscriptions = forward(Messaging.lite_subscriptions)
    delete_lite_topic = forward(Messaging.delete_lite_topic)
    pull = forward(Messaging.pull)
    bulk_read = forward(Messaging.bulk_read)
    get_offset = forward(Messaging.get_offset)
    update_offset = forward(Messaging.update_offset)
    query_offset = forward(Messaging.query_offset)
    reset_offset = forward(Messaging.reset_offset)
    seek_group = forward(Messaging.seek_group)

    end_transaction = forward(Transactions.end_transaction)
    end_transaction_nowait = forward_pending(Transactions.end_transaction_nowait)
    end_transaction_group_nowait = forward_pending(Transactions.end_transaction_group_nowait)
    end_transaction_group = forward(Transactions.end_transaction_group)
    transactional_ack = forward(Transactions.transactional_ack)
    transactional_reject = forward(Transactions.transactional_reject)
    transactional_offset = forward(Transactions.transactional_offset)
    list_transactions = forward(Transactions.list_transactions)
    parked_transactions = forward(Transactions.parked_transactions)
    resume_transaction = forward(Transactions.resume_transaction)
    transaction_stats = forward(Transactions.transaction_stats)

    messages_by_id = forward(Browsing.messages_by_id)
    message_trace = forward(Browsing.message_trace)
    messages_by_key = forward(Browsing.messages_by_key)
    message_at = forward(Browsing.message_at)
    scan = forward(Browsing.scan)

    # Broker to broker (a cluster's transaction groups, halfmoon/cluster/internal/txn_groups.py).
    def apply_transaction_group(
        self, group_id: str, resolution: Resolution, source: DecisionSource
    ) -> int:
        """A coordinator's decision applied to this broker's members of the group."""
        return int(self._call("apply_transaction_group", [group_id, resolution, source]))

    def transaction_group_decision(self, group_id: str) -> Resolution | None:
        """Commit, rollback or None: the decision this broker recorded on the group."""
        answer = self._call("transaction_group_decision", [group_id])
        return None if answer is None else Resolution.of(answer)
