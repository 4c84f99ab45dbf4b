"""An AMQP queue's operations as broker facade calls, awaitable from the event loop.

A queue is a one-queue MIXED topic and a consumer group of the same name
(:mod:`halfmoon.amqp.names`), consuming from the earliest message. Calls the
facade says may block run on the worker pool; the ``*_nowait`` forms run on
the loop when their ``*_cheaply`` check allows. Deliveries are pops hidden for
the delivery timeout (``server.amqp_consumer_timeout``, ``DELIVERY_TIMEOUT_MS``
by default): AMQP has no visibility timeout, so an unacked delivery stays with
its channel until then (RabbitMQ's ``consumer_timeout`` is 30 minutes too); a
requeue makes it visible at once.

Behind a cluster proxy a delivery can be settled only through the connection
it went to, which lives in the proxy's process: receives name that process
as the deliveries' holder (its lease, ``delivery_holder``), so the broker
returns them to the queue, redelivered, once the lease ends, and keeps them
hidden across its own restart while it lasts. ``halfmoon serve`` holds its
deliveries itself (no holder): a restart ends its connections and makes them
visible at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from halfmoon.amqp.message import expired
from halfmoon.broker.errors import GroupExists, GroupNotFound, TopicExists, TopicNotFound
from halfmoon.broker.facade import Broker, Pending, Written
from halfmoon.broker.filter_spec import MATCH_ALL
from halfmoon.broker.message import MessageType, MessageView, OutgoingMessage
from halfmoon.broker.transactions import DecisionSource, Resolution
from halfmoon.errors import HalfmoonError, Unavailable

T = TypeVar("T")
log = logging.getLogger("halfmoon.amqp")


@dataclass(frozen=True)
class TxSettle:
    """An ack (``requeue`` False) or a requeue of the delivery ``handle`` of queue ``stored``,
    applied when its transaction commits."""

    stored: str
    handle: str
    requeue: bool


DELIVERY_TIMEOUT_MS = 30 * 60 * 1000
# A settle whose broker is away (cluster mode) is tried again this often, for this long.
SETTLE_RETRY_EVERY_S = 0.5
SETTLE_RETRY_S = 30.0
BULK_READ_MESSAGES = 4096
BULK_READ_BYTES = 16 * 1024 * 1024  # the broker's bulk_read limit
MAX_DELIVERY_ATTEMPTS = 1000  # the group limit: requeued more often, a message dead-letters


def same_content(copies: Sequence[OutgoingMessage]) -> list[list[OutgoingMessage]]:
    """The copies grouped by everything but their queue: copies that differ only there
    (the usual case: one group) are stored as one record. They differ where the target
    queues' arguments make the message differ (``x-message-ttl``: its own deadline)."""
    runs: list[list[OutgoingMessage]] = []
    for copy in copies:
        for run in runs:
            if replace(run[0], topic=copy.topic) == copy:
                run.append(copy)
                break
        else:
            runs.append([copy])
    return runs


def topics(copies: Sequence[OutgoingMessage]) -> list[str]:
    return [copy.topic for copy in copies]


class Queues:
    def __init__(
        self,
        broker: Broker,
        executor: Executor | None,
        delivery_timeout_ms: int = DELIVERY_TIMEOUT_MS,
        delivery_holder: Callable[[], str] | None = None,
    ) -> None:
        self._broker = broker
        self._executor = executor
        self._delivery_timeout_ms = delivery_timeout_ms
        self._holder = delivery_holder or (lambda: "")

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, call, *args)

    # -- lifecycle ----------------------------------------------------------------

    async def create(self, stored: str, max_priority: int | None = None) -> None:
        """The queue's topic and group; with ``max_priority``, a priority topic with a queue
        per priority from 0 to it (the broker's priority messages: highest queue first)."""
        await self._run(self._create, stored, max_priority)

    def _create(self, stored: str, max_priority: int | None) -> None:
        broker = self._broker
        with contextlib.suppress(TopicExists):
            if max_priority is None:
                broker.create_topic(stored, MessageType.MIXED, queue_count=1)
            else:
                broker.create_topic(stored, MessageType.PRIORITY, queue_count=max_priority + 1)
        with contextlib.suppress(GroupExists):
            broker.create_group(
                stored, consume_from="earliest", max_delivery_attempts=MAX_DELIVERY_ATTEMPTS
            )
        broker.subscribe(stored, stored)

    async def delete(self, stored: str) -> None:
        await self._run(self._delete, stored)

    def _delete(self, stored: str) -> None:
        with contextlib.suppress(GroupNotFound):
            self._broker.delete_group(stored)
        with contextlib.suppress(TopicNotFound):
            self._broker.delete_topic(stored)

    async def counts(self, stored: str) -> int:
        """Messages ready: never delivered, or requeued (nacked, rejected, returned by a closed
        channel or a cancelled consumer) and not delivered again; unacked ones are not."""
        return await self._run(self._ready, stored)

    def _ready(self, stored: str) -> int:
        try:
            progress = self._broker.group_progress(stored, stored)
        except (TopicNotFound, GroupNotFound):
            return 0
        return sum(p.ready for p in progress)

    async def expired_at_head(self, stored: str, now_ms: int, limit: int) -> dict[int, int]:
        """Per queue id, how many messages from its head have expired (at most ``limit``);
        only queues with nothing in flight, whose head is the next message a receive takes."""
        return await self._run(self._expired_at_head, stored, now_ms, limit)

    def _expired_at_head(self, stored: str, now_ms: int, limit: int) -> dict[int, int]:
        found: dict[int, int] = {}
        try:
            progress = self._broker.group_progress(stored, stored)
        except (TopicNotFound, GroupNotFound):
            return found
        for p in progress:
            if p.inflight or p.lag <= 0:
                continue
            count = 0
            offset = p.committed_offset
            while count < limit and offset < p.max_offset:
                try:
                    view = self._broker.message_at(stored, p.queue_id, offset)
                except HalfmoonError:
                    break
                if not expired(view, now_ms):
                    break
                count += 1
                offset += 1
            if count:
                found[p.queue_id] = count
        return found

    async def ready_bytes(self, stored: str, cap: int) -> int:
        """Body bytes of the messages from each queue's first unacked one on, read until the
        sum passes ``cap`` (then some number above it)."""
        return await self._run(self._ready_bytes, stored, cap)

    def _ready_bytes(self, stored: str, cap: int) -> int:
        total = 0
        try:
            progress = self._broker.group_progress(stored, stored)
        except (TopicNotFound, GroupNotFound):
            return 0
        for p in progress:
            offset = p.committed_offset
            while offset < p.max_offset and total <= cap:
                got = self._broker.bulk_read(
                    stored,
                    stored,
                    p.queue_id,
                    offset,
                    BULK_READ_MESSAGES,
                    max(1, min(cap - total + 1, BULK_READ_BYTES)),
                    MATCH_ALL,
                    p.max_offset,
                )
                if not got.messages or got.next_offset <= offset:
                    break
                total += sum(len(m.body) for m in got.messages)
                offset = got.next_offset
        return total

    async def purge(self, stored: str) -> int:
        return await self._run(self._purge, stored)

    def _purge(self, stored: str) -> int:
        ready = self._ready(stored)
        status = self._broker.topic_status(stored)
        self._broker.seek_group(stored, stored, {s.queue_id: s.max_offset for s in status})
        return ready

    # -- messages -----------------------------------------------------------------

    async def fanout(self, copies: Sequence[OutgoingMessage]) -> asyncio.Future[Any] | None:
        """Store one publish's copies (one per queue), each run of equal copies stored once
        (``Broker.send_fanout``); the future of their durability, None when durable already.

        Runs are stored one after another, each all or nothing: a refusal of a later run
        (its queue's topic gone, the store refusing) leaves the earlier ones stored and the
        publish is nacked, as RabbitMQ nacks a publish one of whose queues refused it while
        the others keep it. Copies differ only where a queue's arguments make them (a TTL,
        a priority) or for dead-lettered copies, so one run is the usual case. A run the
        broker writes at once (it only appends) takes no loop turn, so publishes are stored
        in their order; one it cannot (a topic to create, a broker a network hop away) is
        awaited before the next run."""
        broker = self._broker
        durable: list[Future[None]] = []
        for run in same_content(copies):
            written = await broker.send_fanout_nowait(run[0], topics(run[1:])).written()
            if not written.durable.done() or written.durable.exception() is not None:
                durable.append(written.durable)
        if not durable:
            return None
        if len(durable) == 1:
            return asyncio.wrap_future(durable[0])
        return asyncio.gather(*(asyncio.wrap_future(f) for f in durable))

    async def receive(
        self, stored: str, count: int, client_id: str, queue_id: int | None = None
    ) -> tuple[list[MessageView], int | None]:
        """Up to ``count`` deliveries (of queue ``queue_id`` only, when given) and, when none,
        when one may next be due (epoch ms; None when the broker could not answer on the
        loop)."""
        broker = self._broker
        timeout = self._delivery_timeout_ms
        holder = self._holder()
        got = broker.receive_nowait(
            stored, stored, MATCH_ALL, count, timeout, client_id, queue_id, holder
        )
        if isinstance(got, Written):
            return got.result.views, got.result.next_wakeup_ms
        # Pending: the plain receive on a worker, not the answer's write, which would also ask
        # when a delivery is next due (in a cluster, a call to every broker of the queue) for
        # a time no caller here needs: a parked consumer rechecks on its own clock.
        views = await self._run(
            broker.receive, stored, stored, MATCH_ALL, count, timeout, client_id, queue_id, holder
        )
        return views, None

    async def ack(self, stored: str, handles: Sequence[str]) -> None:
        done = self._broker.ack_nowait(stored, stored, handles)
        if isinstance(done, Pending):  # each on a worker, tried again while the broker is away
            await self._settle_each(self._ack_one, stored, list(handles))

    def _ack_one(self, stored: str, handle: str) -> None:
        self._broker.ack(stored, stored, handle)

    async def requeue(self, stored: str, handles: Sequence[str]) -> None:
        await self._settle_each(self._requeue_one, stored, list(handles))

    def _requeue_one(self, stored: str, handle: str) -> None:
        self._broker.change_invisible_duration(stored, stored, handle, 0)

    async def _settle_each(
        self, settle: Callable[[str, str], None], stored: str, handles: list[str]
    ) -> None:
        """``settle`` each handle on the worker pool. A delivery already gone (timed out, its
        queue deleted) is settled enough; one whose broker is away (down or restarting, in a
        cluster) is tried again every ``SETTLE_RETRY_EVERY_S`` for up to ``SETTLE_RETRY_S``, the
        channel waiting: dropped, the ack would leave its delivery hidden and then deliver it
        again after the consumer timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_RETRY_S
        while True:
            handles = await self._run(self._settled_but_unreached, settle, stored, handles)
            if not handles:
                return
            if loop.time() >= deadline:
                log.warning(
                    "event=amqp_settle_dropped queue=%s deliveries=%d", stored, len(handles)
                )
                return
            await asyncio.sleep(SETTLE_RETRY_EVERY_S)

    def _settled_but_unreached(
        self, settle: Callable[[str, str], None], stored: str, handles: list[str]
    ) -> list[str]:
        """Settle each handle; those whose broker could not be reached."""
        unreached = []
        for handle in handles:
            try:
                settle(stored, handle)
            except Unavailable:
                unreached.append(handle)
            except HalfmoonError:
                pass  # gone: nothing left to settle
        return unreached

    # -- transactions ---------------------------------------------------------------

    async def tx_commit(
        self,
        group_id: str,
        members: Sequence[OutgoingMessage],
        settles: Sequence[TxSettle],
    ) -> None:
        """Store a transaction's ``members`` (messages of the group ``group_id``), register its
        ``settles`` with it and commit it, in one job on the worker pool; returns once the
        decision and the members are durable. Written back to back, they share one fsync
        (the decision's record follows the members in the log), where members sent one by
        one as they were published would cost each transaction an fsync of its own. Refused
        (a settle fenced, a member refused), the group is rolled back: nothing applies."""
        durable = await self._run(self._tx_commit, group_id, members, settles)
        await asyncio.gather(*(asyncio.wrap_future(f) for f in durable))

    def _tx_commit(
        self,
        group_id: str,
        members: Sequence[OutgoingMessage],
        settles: Sequence[TxSettle],
    ) -> list[Future[Any]]:
        broker = self._broker
        durable: list[Future[Any]] = []
        try:
            if members:
                durable.append(broker.send_nowait(members).write().durable)
            for settle in settles:
                if settle.requeue:
                    broker.transactional_reject(
                        group_id, settle.stored, settle.stored, settle.handle, 0, False
                    )
                else:
                    broker.transactional_ack(group_id, settle.stored, settle.stored, settle.handle)
            written = broker.end_transaction_group_nowait(
                group_id, Resolution.COMMIT, DecisionSource.CLIENT, len(settles)
            ).write()
        except HalfmoonError:
            if members or settles:  # the broker knows the group: it is rolled back
                with contextlib.suppress(HalfmoonError):
                    broker.end_transaction_group(
                        group_id, Resolution.ROLLBACK, DecisionSource.CLIENT, None
                    )
            raise
        return [written.durable, *durable]
