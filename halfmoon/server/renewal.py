"""Auto-renewal: keep a push consumer's messages invisible while its listener works on them.

Push consumers receive with ``auto_renew = true`` and never extend an
invisible time themselves. Apache RocketMQ's proxy (ReceiptHandleProcessor,
DefaultReceiptHandleManager, RenewStrategyPolicy; ProxyConfig defaults in
brackets) renews for them; halfmoon does the same here:

* A ReceiveMessage with ``auto_renew`` hides its messages for
  ``server.auto_renew_invisible_time`` (60 s, ``defaultInvisibleTimeMills``;
  the client's own duration is ignored, as the proxy ignores it) and tracks
  each receipt handle under (client id, group, original handle).
* One task on the event loop wakes when the earliest tracked handle is due,
  ``renew_ahead_time`` (10 s, ``renewAheadTimeMillis``) before it becomes
  visible again, and at least every ``renew_schedule_period`` (5 s,
  ``renewSchedulePeriodMillis``). Due handles are renewed on the worker
  pool, ``RENEW_BATCH`` (64) per call, by ``broker.change_invisible_duration``
  with the current handle: the n-th renewal hides the message
  ``renew_durations[n]`` (1, 3, 5, 10, 30 min, then 1 h; the policy's
  table), and the new handle replaces the current one.
* ``renew_max_time`` (3 h, ``renewMaxTimeMillis``) after the first
  delivery, the message instead gets the group's retry backoff for its
  attempt and is forgotten (the proxy's STOP_RENEW: it comes back as a
  failed delivery).
* A failed renewal is retried on the next round, ``renew_max_retries``
  (3, ``maxRenewRetryTimes``) times; an invalid handle (acked or
  dead-lettered another way, or already visible again) is forgotten at once.
* AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue
  carry the client's *original* handle: its record is removed and the
  current handle used instead (after a renewal in flight on it finished, so
  the two never race). Unknown handles pass through unchanged.
* NotifyClientTermination forgets the client's handles and gives each
  ``renew_clear_invisible_time`` (1 s, ``invisibleTimeMillisWhenClear``)
  so another consumer gets them soon (the proxy's CLEAR_GROUP). A telemetry
  stream that ends without the client opening another within one
  ``renew_schedule_period`` counts the same (the proxy waits for the
  client's registration to expire).
* Only clients with an open telemetry stream are renewed for (the proxy
  answers an auto-renew receive from a client without one with
  MESSAGE_NOT_FOUND); halfmoon serves the receive, unrenewed.
* At most ``renew_max_handles`` (100 000) handles are tracked; receives
  beyond that are served unrenewed, with a warning.

Costs: O(log n) per tracked message and per release; a round touches only
due handles. Heap entries of released handles are dropped when their time
comes, or in a compaction once they outnumber live ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from halfmoon.broker.facade import Broker
from halfmoon.broker.receipt import InvalidReceiptHandle
from halfmoon.config import ServerConfig

log = logging.getLogger("halfmoon.server.renewal")

# Renewals per worker-pool call.
RENEW_BATCH = 64
_COMPACT_SLACK = 1024
_WARN_INTERVAL_MS = 60_000


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(eq=False, slots=True)
class Tracked:
    """One message a push consumer is processing."""

    client_id: str
    group: str
    topic: str
    original: str  # the handle the client holds
    handle: str  # the current one (after renewals)
    visible_at: int  # ms, when the current handle's invisible time ends (estimate)
    first_ms: int  # when it was received; renew_max_time counts from here
    attempt: int  # delivery attempt, for the retry backoff when renewing stops
    renewals: int = 0
    failures: int = 0
    live: bool = True  # False once released, dropped or given up
    busy: asyncio.Future | None = field(default=None)  # a renewal under way


class RenewalBook:
    """The bookkeeping, without I/O: which handles to renew when, and with what."""

    def __init__(self, config: ServerConfig, now_ms: Callable[[], int] = wall_ms) -> None:
        self.config = config
        self.now_ms = now_ms
        self._items: dict[tuple[str, str, str], Tracked] = {}
        self._by_client: dict[str, set[tuple[str, str, str]]] = {}
        self._heap: list[tuple[int, int, Tracked]] = []
        self._seq = itertools.count()
        self._last_full_warning = -_WARN_INTERVAL_MS

    def __len__(self) -> int:
        return len(self._items)

    @property
    def ahead_ms(self) -> int:
        return int(self.config.renew_ahead_time * 1000)

    def track(
        self, client_id: str, group: str, topic: str, handle: str, invisible_ms: int, attempt: int
    ) -> bool:
        """Start renewing ``handle``; False (and not tracked) when the book is full."""
        key = (client_id, group, handle)
        if key in self._items:
            return True
        now = self.now_ms()
        if len(self._items) >= self.config.renew_max_handles:
            if now - self._last_full_warning >= _WARN_INTERVAL_MS:
                self._last_full_warning = now
                log.warning(
                    "event=renewal_full tracked=%d: new push deliveries are not renewed "
                    "(raise server.renew_max_handles)",
                    len(self._items),
                )
            return False
        item = Tracked(client_id, group, topic, handle, handle, now + invisible_ms, now, attempt)
        self._items[key] = item
        self._by_client.setdefault(client_id, set()).add(key)
        self._schedule(item)
        return True

    def next_due(self) -> int | None:
        """When the earliest heap entry is due (it may be stale); None when empty."""
        return self._heap[0][0] if self._heap else None

    def due(self, now: int, limit: int) -> list[Tracked]:
        """Up to ``limit`` live handles due for renewal at ``now``, taken off the timer."""
        out: list[Tracked] = []
        heap = self._heap
        while heap and heap[0][0] <= now and len(out) < limit:
            due_at, _, item = heapq.heappop(heap)
            if item.live and item.busy is None and due_at == item.visible_at - self.ahead_ms:
                out.append(item)
        return out

    def plan(self, item: Tracked, now: int) -> int | None:
        """How long the next renewal hides ``item`` (ms); None once renewing must stop."""
        if now - item.first_ms >= self.config.renew_max_time * 1000:
            return None
        durations = self.config.renew_durations or (60.0,)
        return int(durations[min(item.renewals, len(durations) - 1)] * 1000)

    def renewed(self, item: Tracked, handle: str, invisible_ms: int, now: int) -> None:
        item.handle = handle
        item.visible_at = now + invisible_ms
        item.renewals += 1
        item.failures = 0
        if item.live:
            self._schedule(item)

    def failed(self, item: Tracked, error: BaseException, now: int) -> None:
        """A renewal failed: retry next round, or give up (invalid handle, too many tries)."""
        item.failures += 1
        if isinstance(error, InvalidReceiptHandle) or item.failures > self.config.renew_max_retries:
            self.forget(item)
        elif item.live:
            retry_at = now + int(self.config.renew_schedule_period * 1000)
            item.visible_at = max(item.visible_at, retry_at + self.ahead_ms)
            self._schedule(item)

    def release(self, client_id: str, group: str, handle: str) -> Tracked | None:
        """Stop renewing the message whose original handle is ``handle``; its record, if any."""
        item = self._items.get((client_id, group, handle))
        if item is not None:
            self.forget(item)
        return item

    def drop_client(self, client_id: str) -> list[Tracked]:
        """Forget every handle of ``client_id``; the records (to make visible soon)."""
        keys = self._by_client.pop(client_id, set())
        items = [self._items.pop(key) for key in keys if key in self._items]
        for item in items:
            item.live = False
        return items

    def forget(self, item: Tracked) -> None:
        item.live = False
        key = (item.client_id, item.group, item.original)
        if self._items.get(key) is item:
            del self._items[key]
            keys = self._by_client.get(item.client_id)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_client[item.client_id]

    def clients(self) -> Iterable[str]:
        return self._by_client.keys()

    def _schedule(self, item: Tracked) -> None:
        heapq.heappush(self._heap, (item.visible_at - self.ahead_ms, next(self._seq), item))
        if len(self._heap) > 2 * len(self._items) + _COMPACT_SLACK:
            self._heap = [entry for entry in self._heap if entry[2].live]
            heapq.heapify(self._heap)


Call = Callable[..., Awaitable[Any]]


class Renewer:
    """Runs the renewal rounds on the event loop; broker calls go through ``call`` (a worker)."""

    def __init__(
        self,
        broker: Broker,
        config: ServerConfig,
        call: Call,
        has_stream: Callable[[str], bool],
        now_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.broker = broker
        self.config = config
        self.book = RenewalBook(config, now_ms)
        self._call = call
        self._has_stream = has_stream
        self._suspects: dict[str, int] = {}  # client id -> when to check its stream again
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._closed = False
        self._clearing: set[asyncio.Task[None]] = set()  # held: the loop's references are weak

    @property
    def enabled(self) -> bool:
        return self.config.auto_renew and not self._closed

    @property
    def invisible_ms(self) -> int:
        return int(self.config.auto_renew_invisible_time * 1000)

    # -- hooks for the servicer (event loop) ---------------------------------------

    def track(self, client_id: str, group: str, topic: str, views: Iterable[Any]) -> None:
        """Renew these freshly received messages until released."""
        if not self.enabled or not client_id or not self._has_stream(client_id):
            # Without a telemetry stream nothing would tell us the client left (RocketMQ's
            # proxy refuses such a receive): its messages simply expire.
            return
        earliest = self.book.next_due()
        for view in views:
            if view.receipt_handle:
                self.book.track(
                    client_id,
                    group,
                    topic,
                    view.receipt_handle,
                    view.invisible_duration_ms or self.invisible_ms,
                    view.delivery_attempt or 1,
                )
        self._start()
        due = self.book.next_due()
        if self._wake is not None and due is not None and (earliest is None or due < earliest):
            self._wake.set()

    async def current(self, client_id: str, group: str, handle: str) -> str:
        """The handle to use for the client's ``handle``; stops renewing it."""
        if not self.book or not client_id:
            return handle
        item = self.book.release(client_id, group, handle)
        if item is None:
            return handle
        if item.busy is not None:
            await asyncio.shield(item.busy)  # the renewal in flight decides the current handle
        return item.handle

    def client_terminated(self, client_id: str) -> None:
        """NotifyClientTermination: make its messages visible again soon."""
        self._suspects.pop(client_id, None)
        self._clear(self.book.drop_client(client_id))

    def stream_closed(self, client_id: str) -> None:
        """Its telemetry stream ended: drop its handles unless it opens another one soon."""
        if client_id in self.book.clients():
            grace = int(self.config.renew_schedule_period * 1000)
            self._suspects[client_id] = self.book.now_ms() + grace
            if self._wake is not None:
                self._wake.set()

    def close(self) -> None:
        """Stop renewing (shutdown); tracked messages become visible when their time ends."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()

    # -- the loop -----------------------------------------------------------------

    def _start(self) -> None:
        if self._task is None and not self._closed:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        assert self._wake is not None
        period_ms = int(self.config.renew_schedule_period * 1000)
        while not self._closed:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - renewal must outlive one bad round
                log.exception("event=renewal_round_failed")
            now = self.book.now_ms()
            wait_ms = period_ms
            due = self.book.next_due()
            if due is not None:
                wait_ms = min(wait_ms, due - now)
            for check_at in self._suspects.values():
                wait_ms = min(wait_ms, check_at - now)
            self._wake.clear()
            if wait_ms > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait_ms / 1000)

    async def round(self) -> None:
        """Check departed clients, then renew every handle that is due, batch by batch."""
        now = self.book.now_ms()
        for client_id, check_at in list(self._suspects.items()):
            if check_at <= now:
                del self._suspects[client_id]
                if not self._has_stream(client_id):
                    log.info("event=renewal_client_gone client_id=%s", client_id)
                    self._clear(self.book.drop_client(client_id))
        while True:
            now = self.book.now_ms()
            batch = self.book.due(now, RENEW_BATCH)
            if not batch:
                return
            plans = [self.book.plan(item, now) for item in batch]
            done = asyncio.get_running_loop().create_future()
            for item in batch:
                item.busy = done
            try:
                results = await self._call(self._renew_batch, batch, plans)
            except BaseException as exc:
                results = [exc] * len(batch)
                raise
            finally:
                now = self.book.now_ms()
                for item, plan, result in zip(batch, plans, results, strict=True):
                    item.busy = None
                    if isinstance(result, BaseException):
                        self.book.failed(item, result, now)
                    elif plan is None:
                        item.handle = result
                        self.book.forget(item)
                    else:
                        self.book.renewed(item, result, plan, now)
                done.set_result(None)

    def _renew_batch(self, batch: list[Tracked], plans: list[int | None]) -> list[Any]:
        """On a worker: change each invisible time; the new handle or the exception, per item."""
        results: list[Any] = []
        for item, plan in zip(batch, plans, strict=True):
            try:
                invisible_ms = plan if plan is not None else self._retry_delay_ms(item)
                results.append(
                    self.broker.change_invisible_duration(
                        item.group, item.topic, item.handle, invisible_ms
                    )
                )
            except Exception as exc:  # noqa: BLE001 - reported per item
                results.append(exc)
        return results

    def _retry_delay_ms(self, item: Tracked) -> int:
        return self.broker.get_group(item.group).retry_policy.delay_for_attempt(item.attempt)

    def _clear(self, items: list[Tracked]) -> None:
        if items and not self._closed:
            task = asyncio.get_running_loop().create_task(self._make_visible(items))
            self._clearing.add(task)
            task.add_done_callback(self._clearing.discard)

    async def _make_visible(self, items: list[Tracked]) -> None:
        clear_ms = int(self.config.renew_clear_invisible_time * 1000)
        for item in items:
            if item.busy is not None:
                await asyncio.shield(item.busy)

        def clear_all() -> None:
            for item in items:
                # It may have been acked meanwhile, or be visible again already.
                with contextlib.suppress(Exception):
                    self.broker.change_invisible_duration(
                        item.group, item.topic, item.handle, clear_ms
                    )

        await self._call(clear_all)
