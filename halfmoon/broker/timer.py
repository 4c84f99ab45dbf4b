"""Delay messages: held in ``%HM_TIMER%`` until their time, then re-appended to their queue.

Algorithm. The send path stores a future delivery in the timer topic's queue
0 (real topic and queue in ``REAL_TOPIC`` / ``REAL_QID``, time in
``TIMER_DELIVER_MS``). Each entry has a key ``(due_ms, timer_queue_offset)``;
keys are unique and totally ordered. :meth:`DelayTimer.tick` (called every
~100 ms by the broker's tick):

1. scans the timer queue forward from ``scan_offset`` (each entry read once);
   an entry whose key is below the bound ``B`` (already overdue) is delivered
   at once; one due within ``window_ms`` goes into an in-memory min-heap if the
   heap has room (``max_heap``) and its key is below every far entry's; any
   other is *far*: only the count and the smallest far key are kept in memory,
   the entry itself stays on disk;
2. delivers heap entries in key order while they are due and below the
   smallest far key: it re-reads the record, appends it to the real topic and
   queue with the same message id and properties (minus the routing ones);
3. rescans ``[low, scan_offset)`` when the smallest far key is due (or within
   half a window, at most once a second): it rebuilds the heap from the
   ``max_heap`` smallest pending keys due within the window and recomputes the
   far count, the smallest far key and ``low`` (the first pending offset);
4. advances ``B`` to the smallest pending key (capped at ``now + 1``): every
   scanned entry with a key below ``B`` has been delivered, every one at or
   above it is pending. That single pair, with ``scan_offset`` and ``low``, is
   the whole durable progress, in ``<metadata_dir>/timer.json``.

Recall. :meth:`DelayTimer.cancel` marks a pending key as recalled; the entry
stays on disk and :meth:`_deliver` skips it when its time comes. A key is
pending iff its offset is at or past ``scan_offset`` or the key is at or above
``B``; any other one was delivered and cannot be recalled. The recalled keys
are part of ``timer.json``, written (with the last persisted progress) before
``cancel`` returns, so a recall survives a crash; a key is dropped from the
file once ``B`` has passed it by an hour (until then recalling it again is an
idempotent success).

Memory is bounded by ``max_heap`` whatever is waiting on disk; a rescan costs
a read of the pending range, and happens about once per half window while far
entries exist (default window: one hour).

Durability. The progress file is written (atomically) at most every
``persist_interval_ms`` and on close, and only after the deliveries it covers
are durable in the store. After a crash, deliveries made since the last write
happen again (same message id): at-least-once, with a duplicate window of one
persist interval (5 s by default). Nothing is lost: undelivered entries are
still in the timer queue (until retention removes them; a delay longer than
the store's retention is lost and logged). Without a metadata directory the
progress is not kept at all.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from halfmoon.broker.config import read_json, write_json_atomic
from halfmoon.broker.message import (
    PROPERTY_DELIVERY_TIME,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
)
from halfmoon.broker.recall import RecallTooLate
from halfmoon.broker.timer_journal import RECORD_EVERY_MS, TimerJournal
from halfmoon.broker.topics import TIMER_TOPIC
from halfmoon.errors import InvalidArgument, NotFound
from halfmoon.store.api import GetStatus, Store
from halfmoon.store.message import Message, StoredMessage

log = logging.getLogger(__name__)

Key = tuple[int, int]  # (due_ms, timer queue offset)
QUEUE_ID = 0
_READ_BATCH = 256
_RESCAN_MIN_INTERVAL_MS = 1_000
# How long past its delivery time a recalled key is remembered (a second recall still succeeds).
_RECALL_MEMORY_MS = 3_600_000

# (topic, wanted queue id) -> the queue id to deliver to, or None when the topic is gone.
RouteFn = Callable[[str, int], int | None]


def due_of(stored: StoredMessage) -> int:
    try:
        return int(stored.properties.get(PROPERTY_DELIVERY_TIME, "0"))
    except ValueError:
        return 0  # a garbled time: deliver now rather than never


class DelayTimer:
    FILE = "timer.json"

    def __init__(
        self,
        store: Store,
        metadata_dir: Path | None,
        route: RouteFn,
        *,
        window_ms: int = 3_600_000,
        max_heap: int = 100_000,
        persist_interval_ms: int = 5_000,
        journal: TimerJournal | None = None,
    ) -> None:
        """``journal``: the progress also goes to the commit log (:mod:`timer_journal`), as a
        broker group's master needs; opening takes the newer of it and ``timer.json``."""
        self._store = store
        self._journal = journal
        self._last_record_ms: int | None = None
        self._path = metadata_dir / self.FILE if metadata_dir is not None else None
        self._route = route
        self._window = window_ms
        self._max_heap = max(1, max_heap)
        self._persist_interval = persist_interval_ms
        self._lock = threading.RLock()
        self._heap: list[tuple[int, int, int]] = []  # (due, offset, commit-log offset)
        self._far_count = 0
        self._far_min: Key | None = None
        self._next_rescan_ms = 0
        self._dirty = False
        self._last_persist_ms: int | None = None
        self._max_end_offset = 0
        self.delivered_total = 0
        self.recalled_total = 0  # recalled entries skipped at their time
        self._recalled: set[Key] = set()
        data = read_json(self._path) if self._path is not None else None
        if (
            journal is not None
            and data
            and int(data["scan_offset"]) > store.max_offset(TIMER_TOPIC, QUEUE_ID)
        ):
            # timer.json claims entries this log does not hold (a tail lost to a crash
            # under an async flush, or cut when a deposed master rejoined): trusting it
            # would skip the entries written at those offsets from now on.
            log.warning("event=timer_progress_ahead_of_log scan_offset=%s", data["scan_offset"])
            data = None
        if journal is not None:
            data = _newer(data, journal.latest())
        start = store.min_offset(TIMER_TOPIC, QUEUE_ID)
        if data:
            self._scan_offset = int(data["scan_offset"])
            self._low = int(data["low"])
            self._bound: Key = (int(data["bound"][0]), int(data["bound"][1]))
            self._recalled = {(int(due), int(offset)) for due, offset in data.get("recalled", ())}
        else:
            self._scan_offset = self._low = start
            self._bound = (0, 0)
        # What timer.json says now: a recall rewrites the file with it, claiming no new delivery.
        self._persisted: tuple[int, int, Key] = (self._scan_offset, self._low, self._bound)
        # Pending entries below scan_offset are only on disk until the first rescan.
        self._needs_rescan = self._low < self._scan_offset

    # -- observability ---------------------------------------------------------
    @property
    def heap_size(self) -> int:
        return len(self._heap)

    @property
    def pending(self) -> int:
        """Delay messages waiting, recalled ones excluded (exact after the first tick)."""
        with self._lock:
            scanned_recalled = sum(
                1 for key in self._recalled if key[1] < self._scan_offset and key >= self._bound
            )
            return max(0, len(self._heap) + self._far_count - scanned_recalled)

    # -- recall ------------------------------------------------------------------
    def cancel(self, key: Key, message_id: str) -> None:
        """Recall the pending entry ``key`` = ``(due_ms, timer offset)``; durable on return.

        Idempotent while the key is remembered. Raises :class:`RecallTooLate`
        when the entry was delivered already. The caller checks that ``key``
        names a real timer record (see :mod:`recall`).
        """
        with self._lock:
            if key in self._recalled:
                return
            if key[1] < self._scan_offset and key < self._bound:
                raise RecallTooLate(
                    f"delay message {message_id} was already delivered (due at {key[0]} ms); "
                    "a delay message can be recalled only before its delivery time"
                )
            self._recalled.add(key)
            if self._path is None:
                return
            scan_offset, low, bound = self._persisted
            try:
                end = self._write(scan_offset, low, bound)
                if self._journal is not None and end is not None:
                    self._journal.wait(end)  # on the in-sync replicas before it is answered
            except BaseException:
                self._recalled.discard(key)  # not durable: the recall did not happen
                raise

    # -- the work --------------------------------------------------------------
    def tick(self, now_ms: int) -> int:
        """Deliver what is due at ``now_ms``; return how many messages were delivered."""
        with self._lock:
            before = self.delivered_total
            if self._needs_rescan:
                self._rescan(now_ms)
            self._scan_new(now_ms)
            while True:
                try:
                    self._drain(now_ms)
                finally:
                    # A rescan must see what was just delivered as done, and so must a
                    # recall even when a later delivery of this drain failed.
                    self._advance_bound(now_ms)
                far = self._far_min
                if far is None:
                    break
                if far[0] <= now_ms or (
                    far[0] <= now_ms + self._window // 2
                    and len(self._heap) < self._max_heap
                    and now_ms >= self._next_rescan_ms
                ):
                    self._rescan(now_ms)
                    if self._heap and self._heap[0][0] <= now_ms:
                        continue
                break
            self.maybe_persist(now_ms)
            return self.delivered_total - before

    def _scan_new(self, now_ms: int) -> None:
        horizon = now_ms + self._window
        for stored in self._read(self._scan_offset, None):
            key = (due_of(stored), stored.queue_offset)
            self._scan_offset = stored.queue_offset + 1
            self._dirty = True
            if key < self._bound:
                self._deliver(stored)
            elif (
                key[0] < horizon
                and len(self._heap) < self._max_heap
                and (self._far_min is None or key < self._far_min)
            ):
                heapq.heappush(self._heap, (key[0], key[1], stored.commit_log_offset))
            else:
                self._far_count += 1
                if self._far_min is None or key < self._far_min:
                    self._far_min = key

    def _drain(self, now_ms: int) -> None:
        heap = self._heap
        while (
            heap and heap[0][0] <= now_ms and (self._far_min is None or heap[0][:2] < self._far_min)
        ):
            due, offset, clo = heapq.heappop(heap)
            try:
                stored = self._store.read_at(clo)
            except NotFound as exc:  # retention removed it: nothing left to deliver
                log.error("delay message at timer offset %d is gone: %s", offset, exc)
                continue
            try:
                self._deliver(stored)
            except Exception:
                heapq.heappush(heap, (due, offset, clo))  # try again next tick
                raise

    def _rescan(self, now_ms: int) -> None:
        """Rebuild the heap and the far summary from the pending range on disk."""
        self._needs_rescan = False
        self._next_rescan_ms = now_ms + _RESCAN_MIN_INTERVAL_MS
        horizon = now_ms + self._window
        kept: list[tuple[int, int, int]] = []  # max-heap by key: (-due, -offset, clo)
        far_count = 0
        far_min: Key | None = None
        low: int | None = None
        for stored in self._read(self._low, self._scan_offset):
            key = (due_of(stored), stored.queue_offset)
            if key < self._bound:
                continue  # delivered
            if low is None:
                low = stored.queue_offset
            item = (-key[0], -key[1], stored.commit_log_offset)
            if key[0] < horizon:
                if len(kept) < self._max_heap:
                    heapq.heappush(kept, item)
                    continue
                if item > kept[0]:  # smaller key than the largest kept: swap them
                    item = heapq.heapreplace(kept, item)
            far_count += 1
            far_key = (-item[0], -item[1])
            if far_min is None or far_key < far_min:
                far_min = far_key
        self._heap = [(-d, -o, clo) for d, o, clo in kept]
        heapq.heapify(self._heap)
        self._far_count = far_count
        self._far_min = far_min
        new_low = low if low is not None else self._scan_offset
        if new_low != self._low:
            self._low = new_low
            self._dirty = True

    def _advance_bound(self, now_ms: int) -> None:
        candidates: list[Key] = [(now_ms + 1, 0)]
        if self._heap:
            candidates.append(self._heap[0][:2])
        if self._far_min is not None:
            candidates.append(self._far_min)
        bound = max(self._bound, min(candidates))
        if bound != self._bound:
            self._bound = bound
            self._dirty = True
        if not self._heap and self._far_min is None and self._low != self._scan_offset:
            self._low = self._scan_offset
            self._dirty = True

    def _read(self, start: int, stop: int | None) -> Iterator[StoredMessage]:
        offset = start
        while stop is None or offset < stop:
            result = self._store.get(TIMER_TOPIC, QUEUE_ID, offset, _READ_BATCH)
            if result.status is GetStatus.OFFSET_TOO_SMALL:
                log.error(
                    "delay messages at timer offsets %d..%d were removed by retention before "
                    "their delivery time", offset, result.next_offset - 1,
                )  # fmt: skip
                offset = result.next_offset
                if stop is None:
                    self._scan_offset = max(self._scan_offset, offset)
                self._low = min(max(self._low, offset), self._scan_offset)
                continue
            if not result.messages:
                return
            for stored in result.messages:
                if stop is not None and stored.queue_offset >= stop:
                    return
                yield stored
            offset = result.next_offset

    def _deliver(self, stored: StoredMessage) -> None:
        if (due_of(stored), stored.queue_offset) in self._recalled:
            self._dirty = True
            self.recalled_total += 1
            log.info("event=delay_message_recalled message_id=%s", stored.unique_id)
            return
        props = dict(stored.properties)
        topic = props.pop(PROPERTY_REAL_TOPIC, "")
        try:
            wanted = int(props.pop(PROPERTY_REAL_QUEUE_ID, "0"))
        except ValueError:
            wanted = 0
        queue_id = self._route(topic, wanted) if topic else None
        self._dirty = True
        self.delivered_total += 1
        if queue_id is None:
            log.warning(
                "dropping delay message %s: topic %r no longer exists", stored.unique_id, topic
            )
            return
        message = Message(
            topic=topic,
            body=stored.body,
            queue_id=queue_id,
            properties=props,
            flags=stored.flags,
            sys_flag=stored.sys_flag,
            born_timestamp=stored.born_timestamp,
            born_host=stored.born_host,
            reconsume_times=stored.reconsume_times,
        )
        try:
            (result,) = self._store.append([message])
        except InvalidArgument as exc:  # it can never be stored: do not retry forever
            log.error("dropping delay message %s: %s", stored.unique_id, exc)
            return
        self._max_end_offset = max(self._max_end_offset, result.end_offset)

    # -- persistence -----------------------------------------------------------
    def maybe_persist(self, now_ms: int) -> bool:
        if self._last_persist_ms is None:
            self._last_persist_ms = now_ms
        if self._last_record_ms is None:
            self._last_record_ms = now_ms
        # An idle timer still journals now and then: retention must leave a record.
        record_due = self._journal is not None and now_ms - self._last_record_ms >= RECORD_EVERY_MS
        if (
            not (self._dirty or record_due)
            or now_ms - self._last_persist_ms < self._persist_interval
        ):
            return False
        self._last_persist_ms = self._last_record_ms = now_ms
        self.persist(force=record_due)
        return True

    def persist(self, force: bool = False) -> None:
        with self._lock:
            if self._path is None or not (self._dirty or force):
                return
            # Progress may only claim deliveries that will survive a crash.
            self._store.wait_durable(self._max_end_offset)
            self._write(self._scan_offset, self._low, self._bound)
            self._dirty = False

    def _write(self, scan_offset: int, low: int, bound: Key) -> int | None:
        """Write the progress (and journal it); the journal record's end offset."""
        assert self._path is not None
        # Forget a recalled key once delivery passed it long ago (consistently with
        # the progress written beside it).
        self._recalled = {
            key
            for key in self._recalled
            if key[1] >= scan_offset or key >= bound or key[0] >= bound[0] - _RECALL_MEMORY_MS
        }
        document = {
            "version": 1,
            "scan_offset": scan_offset,
            "low": low,
            "bound": list(bound),
            "recalled": sorted(list(key) for key in self._recalled),
        }
        # Appended after the deliveries it claims (persist waited for them): in the log
        # behind them, on a replica as on this broker.
        end = self._journal.record(document) if self._journal is not None else None
        write_json_atomic(self._path, document)
        self._persisted = (scan_offset, low, bound)
        return end


def _newer(
    file: dict[str, object] | None, record: dict[str, object] | None
) -> dict[str, object] | None:
    """The further progress of ``timer.json`` and the journal's newest record, with the
    recalled keys of both (a recall is durable in either)."""
    if record is None or file is None:
        return record if file is None else file
    chosen, other = (record, file) if _progress(record) >= _progress(file) else (file, record)
    recalled = {tuple(key) for key in chosen.get("recalled", ())}  # type: ignore[attr-defined]
    recalled |= {tuple(key) for key in other.get("recalled", ())}  # type: ignore[attr-defined]
    return {**chosen, "recalled": sorted(list(key) for key in recalled)}


def _progress(data: dict[str, object]) -> tuple[int, int, int]:
    bound = data["bound"]
    return (int(bound[0]), int(bound[1]), int(data["scan_offset"]))  # type: ignore[index,call-overload]
