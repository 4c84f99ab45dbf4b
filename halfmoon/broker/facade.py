"""The ``Broker`` facade: every operation the front ends (gRPC servicer, admin API) call.

The front ends talk to this protocol and to nothing below it (no store, no
registries), the way nsqd's ``http.go`` and ``protocol_v2.go`` both end in
``topic.PutMessage``. Today one class implements it, the in-process
:class:`halfmoon.broker.broker.Broker`; a proxy driving a broker in another
process implements the same protocol (``tests/broker/test_facade_contract.py``
is the contract both must pass). Each operation is documented here, once.

Calling conventions:

- Operations are synchronous and may wait for the disk (or, remote, the
  network): a front end on an event loop runs them on a worker thread.
- The exceptions are the ``*_nowait`` calls when their ``*_cheaply`` check
  said yes: they neither read the disk nor wait for a flush, so a front end
  may run them on its event loop. (The checks themselves never block; an
  implementation that cannot promise that, e.g. one a network hop away,
  answers False and its calls go to a worker thread.)
- A ``*_nowait`` call returns a :class:`Written`: its result, and a future
  that completes when the operation's promise holds (durable under the
  flush policy), to be awaited without holding a thread
  (``asyncio.wrap_future``). The plain form of the same call waits for it.
- Errors are :class:`halfmoon.errors.HalfmoonError` subclasses with stable
  codes; each front end maps them to its own wire format.
- A broker a network hop away may also be :class:`SendsAsync`: its sends are
  awaited on the front end's event loop (coalesced there), no worker thread;
  and :class:`WatchesArrivals`: it sends arrival wake-ups only for the topics
  the front end's long polls wait on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from halfmoon.broker.browse import ScanResult
from halfmoon.broker.config import BrokerConfig
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.groups import GroupConfig, RetryPolicy
from halfmoon.broker.lite import OffsetOption, UnsubscribeNotifier
from halfmoon.broker.message import MessageType, MessageView, OutgoingMessage, Received
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
from halfmoon.errors import HalfmoonError
from halfmoon.store.api import GetStatus, StoreStats

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Written(Generic[T]):
    """A ``*_nowait`` answer: ``result`` once written; ``durable`` completes when it may be
    acknowledged (after the fsync under ``sync`` flush, at once under ``async``)."""

    result: T
    durable: Future[None]


@runtime_checkable
class SendsAsync(Protocol):
    """A broker whose sends an event loop can await (a proxy's, over the internal protocol)."""

    async def send_async(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        """``send`` on the caller's event loop: the results once durable. May raise what
        ``send`` raises; must be awaited on the loop the broker's sends first ran on."""
        ...


@runtime_checkable
class WatchesArrivals(Protocol):
    """A broker that calls an arrival listener only for the topics it is told to watch."""

    def add_watched_arrival_listener(self, callback: Callable[[str, int], None]) -> None:
        """As ``add_arrival_listener``, for watched topics only; watching a topic also calls
        it once for that topic (something may have arrived before the watch took effect)."""
        ...

    def watch_arrivals(self, topics: Sequence[str]) -> None:
        """Watch ``topics`` from now on (any thread; never blocks)."""
        ...

    def unwatch_arrivals(self, topics: Sequence[str]) -> None:
        """Stop watching ``topics`` (any thread; never blocks)."""
        ...


@dataclass(frozen=True)
class QueueStatus:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_store_timestamp: int | None  # None for an empty queue
    perm: str


@dataclass(frozen=True)
class QueueProgress:
    group: str
    topic: str
    queue_id: int
    committed_offset: int
    max_offset: int
    lag: int
    inflight: int
    retrying: int = 0  # of those in flight, the ones delivered more than once


@dataclass(frozen=True)
class QueueRoute:
    topic: str
    queue_id: int
    perm: str  # "rw", "r", "w" or "-"
    accepted_types: list[MessageType]
    broker: str = ""  # in cluster mode, the broker owning the queue ("": this broker)


@dataclass
class PullResult:
    status: GetStatus
    messages: list[MessageView]
    next_offset: int
    min_offset: int
    max_offset: int


class Broker(Protocol):
    """What a front end may ask of a broker (see the module docstring for conventions)."""

    # -- lifecycle and settings ----------------------------------------------------

    @property
    def config(self) -> BrokerConfig:
        """The settings in force (read only: change them with :meth:`update_config`)."""
        ...

    def update_config(self, changes: Mapping[str, Any]) -> BrokerConfig:
        """Set ``BrokerConfig`` fields by name, effective at once for the fields the broker
        reads on each use; all names are checked before any changes (``InvalidArgument``)."""
        ...

    def close(self) -> None:
        """Persist metadata, offsets, timer progress and consumption state (not the store)."""
        ...

    def tick(self) -> bool:
        """Background work: due delay messages, dead letters of expired last deliveries,
        transaction checks, periodic persistence.

        Call every ~100 ms from one thread. True while a transaction check scan
        is unfinished: tick again at once rather than after the interval.
        """
        ...

    def add_arrival_listener(self, callback: Callable[[str, int], None]) -> None:
        """Call ``callback(topic, queue_id)`` after messages are appended to a user topic
        (from the appending thread; it must not block). Long polls wake on it."""
        ...

    def set_check_sender(self, sender: CheckSender | None) -> None:
        """Where transaction checks go (live producers' telemetry streams); None: nowhere."""
        ...

    def status(self) -> BrokerStatus:
        """Name, uptime, counts, traffic rates, commit-log offsets, pending delay messages."""
        ...

    def store_stats(self) -> StoreStats:
        """The store's figures: commit-log offsets (written and flushed), segments, disk."""
        ...

    def traffic(self, topic: str | None = None, group: str | None = None) -> list[TrafficRow]:
        """Messages in (per topic) and out (per topic and group) per second and over 24 h."""
        ...

    # -- topics ---------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        message_type: MessageType = MessageType.NORMAL,
        queue_count: int = 8,
        perm: str = "rw",
        brokers: Sequence[str] = (),
    ) -> TopicConfig:
        """A new topic; TopicExists when the name is taken, IllegalTopic for a bad name.

        ``brokers``: in a cluster, the brokers to place its queues on (default: every live
        one); a single broker refuses a non-empty list (InvalidArgument)."""
        ...

    def update_topic(
        self,
        name: str,
        *,
        queue_count: int | None = None,
        perm: str | None = None,
        message_type: MessageType | None = None,
        trace: bool | None = None,
    ) -> TopicConfig:
        """Change queues, permission, type or the trace switch; shrunk queues stay readable
        until drained."""
        ...

    def delete_topic(self, name: str) -> None:
        """Forget the topic, its messages and every group's offsets in it."""
        ...

    def get_topic(self, name: str) -> TopicConfig:
        """The topic; TopicNotFound unless auto-creation is on (then a new mixed topic)."""
        ...

    def find_topic(self, name: str) -> TopicConfig | None:
        """The topic (internal ones included) or None; never creates one."""
        ...

    def list_topics(self) -> list[TopicConfig]:
        """User topics and dead-letter topics (not the broker's internal ones), by name."""
        ...

    def topic_status(self, name: str) -> list[QueueStatus]:
        """Per readable queue: min/max offset, last store time, permission."""
        ...

    def route(self, topic: str) -> list[QueueRoute]:
        """The topic's readable queues with their permission and accepted message types."""
        ...

    # -- consumer groups -------------------------------------------------------------

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
        """A new consumer group; GroupExists when the name is taken. ``consume_from``
        (latest|earliest|auto) None means ``config.default_consume_from``."""
        ...

    def update_group(self, name: str, **changes: Any) -> GroupConfig:
        """Change any of create_group's settings."""
        ...

    def delete_group(self, name: str) -> None:
        """Forget the group, its offsets and its consumption state."""
        ...

    def get_group(self, name: str) -> GroupConfig:
        """The group; GroupNotFound unless auto-creation is on (then a new group)."""
        ...

    def find_group(self, name: str) -> GroupConfig | None:
        """The group or None; never creates one."""
        ...

    def list_groups(self) -> list[GroupConfig]:
        """Every consumer group, by name."""
        ...

    def group_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        """Per queue the group consumed by pop or pull: committed offset, lag, in flight."""
        ...

    def subscribe(self, group: str, topic: str) -> None:
        """Fix a new group's start position in ``topic`` now (when a consumer subscribes)."""
        ...

    # -- produce ----------------------------------------------------------------------

    def send(self, messages: Sequence[OutgoingMessage]) -> list[SendResult]:
        """Validate every message (one bad one: nothing stored) and store them.

        Returns once the promise holds: written, and under the ``sync`` flush
        policy durable. Half messages (type TRANSACTION) are stored invisible
        and get a transaction id; delay messages wait in the timer and get a
        recall handle.
        """
        ...

    def send_nowait(self, messages: Sequence[OutgoingMessage]) -> Written[list[SendResult]]:
        """As :meth:`send`, returning once written; ``durable`` completes when send would."""
        ...

    def sends_cheaply(self, messages: Sequence[OutgoingMessage]) -> bool:
        """True when :meth:`send_nowait` of these messages only appends: every topic exists
        (no topic to create) and no transaction group member needs an index lookup."""
        ...

    def recall(self, topic: str, recall_handle: str) -> str:
        """Cancel a delay message before its delivery time; its message id. Durable on return;
        again is a no-op. IllegalRecallHandle (garbled, forged, another topic's) or
        RecallTooLate."""
        ...

    # -- transactions ------------------------------------------------------------------

    def end_transaction(
        self,
        topic: str,
        message_id: str,
        transaction_id: str,
        resolution: str,
        source: str,
        producer_group: str | None = None,
    ) -> TxnState:
        """Commit, roll back or leave (``unknown``) a transaction; returns once durable.

        ``resolution``: commit|rollback|unknown; ``source``: client|check|operator.
        ``topic`` and ``message_id`` may be empty (an operator knows only the id).
        Repeating a decision is a no-op; the opposite raises TransactionAlreadyEnded;
        a transaction group member is ended with its group (TransactionGroupMember).
        """
        ...

    def end_transaction_nowait(
        self,
        topic: str,
        message_id: str,
        transaction_id: str,
        resolution: str,
        source: str,
        producer_group: str | None = None,
    ) -> Written[EndResult]:
        """As :meth:`end_transaction`, returning once written (``result.state``, ``.changed``)."""
        ...

    def transaction_ends_cheaply(self, transaction_id: str) -> bool:
        """True when :meth:`end_transaction_nowait` for this id needs no index lookup:
        pending (not a group member) or recently decided."""
        ...

    def end_transactions_nowait(
        self, requests: Sequence[EndRequest]
    ) -> list[Written[EndResult] | HalfmoonError]:
        """Many :meth:`end_transaction_nowait` calls at once, in order; each request's error in
        its place. The local broker writes every decision with one store append (and one
        durable future); cheap, in the sense above, when each id is."""
        ...

    def end_transaction_group(
        self,
        group_id: str,
        resolution: str,
        source: str = "client",
        consume_actions: int | None = None,
    ) -> int:
        """Commit or roll back every member of a transaction group atomically; returns once
        durable, with the number of members decided by this call (0 when repeated).

        A commit also applies the group's consume actions (``transactional_*`` below)
        or, when one of them no longer holds, rolls everything back and raises
        ``TransactionFenced``. ``consume_actions``: how many the client registered;
        another number (the broker restarted meanwhile) rolls back and raises
        ``TransactionIncomplete``; None: no check.
        """
        ...

    def end_transaction_group_nowait(
        self,
        group_id: str,
        resolution: str,
        source: str = "client",
        consume_actions: int | None = None,
    ) -> Written[int]:
        """As :meth:`end_transaction_group`, returning once written."""
        ...

    def transactional_ack(
        self, transaction_group: str, group: str, topic: str, receipt_handle: str
    ) -> None:
        """Ack the delivery when ``transaction_group`` commits. The handle is checked now
        (``InvalidReceiptHandle``); nothing changes until the commit."""
        ...

    def transactional_reject(
        self,
        transaction_group: str,
        group: str,
        topic: str,
        receipt_handle: str,
        delay_ms: int | None = None,
        dead_letter: bool = False,
    ) -> None:
        """On commit, redeliver after ``delay_ms`` (None: the group's retry backoff for the
        attempt) or, with ``dead_letter``, move the message to the group's dead-letter topic
        (its copy is stored now, invisible, as a member of the group)."""
        ...

    def transactional_offset(
        self,
        transaction_group: str,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        expected: int,
    ) -> None:
        """On commit, set the pull offset of ``group`` in the queue to ``offset`` if it is still
        ``expected`` then (-1: none committed), else the commit is fenced."""
        ...

    def list_transactions(
        self, topic: str | None = None, limit: int = 1000
    ) -> list[TransactionInfo]:
        """Undecided transactions (prepared and parked), oldest first."""
        ...

    def parked_transactions(self, limit: int = 1000) -> list[TransactionInfo]:
        """Transactions parked after the check limit, oldest first."""
        ...

    def resume_transaction(self, transaction_id: str) -> TransactionInfo:
        """Put a parked transaction back under checks (check count reset)."""
        ...

    def transaction_stats(self) -> TransactionStats:
        """Pending and parked counts, decisions by source, decision latencies."""
        ...

    # -- consume by pop -----------------------------------------------------------------

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
        """Up to ``batch_size`` messages hidden for ``invisible_ms`` (0: the default); [] if none.

        ``queue_id`` receives from that queue only (IllegalQueueId if the topic
        has no such readable queue). Each carries a receipt handle for ack /
        change_invisible_duration /
        forward_to_dead_letter. FIFO groups get at most one message group's
        next message per queue at a time.
        """
        ...

    def receive_nowait(
        self,
        group: str,
        topic: str,
        filter: FilterSpec,
        batch_size: int,
        invisible_ms: int,
        client_id: str = "",
        queue_id: int | None = None,
    ) -> Received | None:
        """As :meth:`receive` when that can neither block nor write; None when it might.

        Cheap enough for an event loop: reads of the page cache and bookkeeping in
        memory. When it finds nothing, ``next_wakeup_ms`` is :meth:`next_wakeup_ms`'s
        answer, so a long poll parks without another call. None (do call
        :meth:`receive`, from a worker thread) when the group's state is busy with
        another call, a delivery is due again (redelivery may dead-letter), the group
        trails a queue far enough that the read may come from disk, the topic or group
        would be created, or the broker is remote.
        """
        ...

    def next_wakeup_ms(self, group: str, topic: str, client_id: str = "") -> int | None:
        """When a message of ``topic`` next becomes visible to ``group`` again (epoch ms).

        For a lite parent topic: over the lite topics ``client_id`` subscribes to.
        """
        ...

    def ack(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None:
        """Consumed: never deliver it again. InvalidReceiptHandle for a stale or bad handle.

        On a lite parent topic, ``lite_topic`` names the lite topic (None: the one the
        receipt handle names); likewise for the two calls below.
        """
        ...

    def ack_nowait(
        self, group: str, topic: str, receipt_handles: Sequence[str]
    ) -> list[Exception | None] | None:
        """Ack a batch of handles of an ordinary topic at once when that cannot block.

        Per handle None (acked) or the error :meth:`ack` would have raised; None
        (nothing acked: call :meth:`ack` per handle from a worker thread) when the
        group's state is busy with another call, the topic is a lite parent, or the
        broker is remote. Bookkeeping in memory only: an event loop may call it.
        """
        ...

    def change_invisible_duration(
        self,
        group: str,
        topic: str,
        receipt_handle: str,
        invisible_ms: int,
        lite_topic: str | None = None,
    ) -> str:
        """Hide the message ``invisible_ms`` from now; the new receipt handle (the old one dies)."""
        ...

    def forward_to_dead_letter(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None:
        """Move the message to the group's dead-letter topic now."""
        ...

    # -- lite topics (RIP-83) -----------------------------------------------------------

    def sync_lite_subscription(
        self,
        client_id: str,
        group: str,
        topic: str,
        action: str,
        lite_topics: Sequence[str],
        offset: OffsetOption | None = None,
    ) -> list[str]:
        """Apply a consumer's SyncLiteSubscription (partial_add / partial_remove /
        complete_add / complete_remove) to lite parent ``topic``; its lite topics after."""
        ...

    def list_lite_topics(self, topic: str) -> list[dict[str, object]]:
        """The lite topics of lite parent ``topic``, with their queue offsets."""
        ...

    def client_terminated(self, client_id: str) -> None:
        """A client said goodbye: its lite subscriptions end with it."""
        ...

    def lite_subscriptions(self, topic: str) -> list[dict[str, object]]:
        """Every consumer client's lite subscriptions under lite parent ``topic``."""
        ...

    def delete_lite_topic(self, topic: str, lite_topic: str) -> int:
        """Delete a lite topic; its subscribers are told. How many subscribers were told."""
        ...

    def set_lite_unsubscribe_notifier(self, notifier: UnsubscribeNotifier | None) -> None:
        """Who tells a client that one of its lite subscriptions was dropped (None: nobody)."""
        ...

    # -- consume by pull (offsets) ---------------------------------------------------------

    def pull(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        batch_size: int,
        filter: FilterSpec,
    ) -> PullResult:
        """Read from one queue at ``offset``; no consumer state changes."""
        ...

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
        """:meth:`pull` for bulk readers (Spark, halfmoon's PullConsumer): up to
        ``max_messages`` (1 to 16,384) and about ``max_bytes`` (1 B to 16 MiB; at least one
        message) of the queue's messages from ``offset``, none at or past ``end_offset``
        (None: no end; ``next_offset`` never passes it). No consumer state changes."""
        ...

    def get_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset; OffsetNotFound when it has none."""
        ...

    def update_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Commit an offset (0 to the queue's max offset)."""
        ...

    def query_offset(
        self, topic: str, queue_id: int, policy: str, timestamp: int | None = None
    ) -> int:
        """``beginning`` (min offset), ``end`` (max offset) or ``timestamp`` (first stored
        at/after)."""
        ...

    def reset_offset(self, group: str, topic: str, timestamp: int) -> dict[int, int]:
        """Move the group (pull offsets and pop position) to ``timestamp`` in every queue."""
        ...

    def seek_group(self, group: str, topic: str, offsets: Mapping[int, int]) -> dict[int, int]:
        """Move the group (pull offsets and pop position) to ``offsets[queue]`` in the named
        queues (deliveries in flight there die); the offsets applied. Every offset is checked
        first (IllegalOffset outside a queue's retained range): none moves unless all can."""
        ...

    # -- reading stored messages (operators; no consumer state changes) -----------------------

    def messages_by_id(self, message_id: str, topic: str | None = None) -> list[MessageView]:
        """Messages with this id in ``topic`` (or in every listed topic: dead-letter copies keep
        the id); MessageNotFound when there is none, TopicNotFound for an unknown topic."""
        ...

    def message_trace(self, message_id: str) -> list[dict[str, Any]]:
        """What the broker recorded about the message with this id, oldest first
        (halfmoon/broker/trace.py): deliveries, acks, retries, dead-lettering of every stored
        copy, and a transactional message's history. Each event is a map with ``time_ms``,
        ``event`` and its fields; [] when nothing was recorded."""
        ...

    def messages_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, limit: int
    ) -> list[MessageView]:
        """Up to ``limit`` messages of ``topic`` with ``key``, stored within [begin_ms, end_ms]."""
        ...

    def message_at(self, topic: str, queue_id: int, offset: int) -> MessageView:
        """The message at ``offset`` of a queue; MessageNotFound when there is none."""
        ...

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
        """Read a range of one queue (or every readable queue) without any group.

        From ``offset`` (one queue only), else the first message stored at or
        after ``begin_ms``, else the queue's start; stops at ``end_ms``, after
        ``limit`` messages (when ``with_messages``) or after examining
        ``browse.MAX_SCAN_ENTRIES`` entries. ``next_offsets`` and ``complete``
        say where to continue.
        """
        ...


def end_each(
    broker: Broker, requests: Sequence[EndRequest]
) -> list[Written[EndResult] | HalfmoonError]:
    """:meth:`Broker.end_transactions_nowait` for brokers that cannot batch decisions: one
    :meth:`Broker.end_transaction_nowait` call per request, each error in its place. Such
    brokers answer :meth:`Broker.transaction_ends_cheaply` with False, so the server batches
    nothing for them and this only serves callers that batch anyway."""
    answers: list[Written[EndResult] | HalfmoonError] = []
    for r in requests:
        try:
            answers.append(
                broker.end_transaction_nowait(
                    r.topic, r.message_id, r.transaction_id, r.resolution, r.source
                )
            )
        except HalfmoonError as exc:
            answers.append(exc)
    return answers
