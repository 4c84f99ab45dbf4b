"""Message trace: what the broker did with each message, kept in its own commit log.

Events (``EVENTS``) are recorded by the broker at the point where it acts, so
a trace needs no client cooperation and sees what clients never see (checks,
operators' decisions, dead-lettering by the revive scan):

- consumption, keyed by the stored record's position (``@<commit-log offset>``,
  :func:`position_key`): ``delivered`` (pop or pull, to a group, at an
  attempt, to a client), ``acked``, ``invisible_changed`` (a nack or a
  consumer asking for more time: the message comes back after that),
  ``dead_lettered``. An ack knows only the receipt handle, which names the
  position, not the message id: keying by position costs no read of the
  message, and a position is never reused within one commit log;
- transactions and resends, keyed by the message id: ``half_stored``,
  ``check_sent``, ``check_answered``, ``committed`` / ``rolled_back`` (with
  who decided: ``producer``, ``check``, ``operator``, or the transaction
  ``group``), ``parked``, ``resumed``, ``resent`` / ``resent_from``.

"Stored" is not recorded: the message itself in its topic says where and
when (the admin API adds it from the message).

Storage: events go to a buffer; :meth:`TraceRecorder.flush` (the broker's
tick, every ~100 ms, and close) appends them to the internal topic
``%TRACE%`` as a few records, each holding up to :data:`KEYS_PER_RECORD`
keys' events as a JSON array with the keys in its ``KEYS`` property, so the
key index finds a trace in one query per key. No send, ack or receive waits
for a trace write and no trace write asks for an fsync of its own (it rides
the next one). A crash loses at most the last tick's events; a clean stop
flushes. Retention removes trace records with the rest of the log, and
replication copies them with it. The buffer is bounded
(:data:`MAX_BUFFERED`): beyond it events are dropped and counted, never
allowed to hold up the broker.

The per-topic switch is ``TopicConfig.trace`` (on by default); the broker's
internal topics are never traced. ``%TRACE%`` itself is internal: no
consumer can subscribe to it, it is in no topic list and counts in no
backlog.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

from halfmoon.broker.clock import Clock
from halfmoon.broker.topics import TRACE_TOPIC
from halfmoon.store.api import Store
from halfmoon.store.message import KEY_SEPARATOR, PROPERTY_KEYS, Message

__all__ = ["EVENTS", "TRACE_TOPIC", "TraceRecorder", "position_key"]

log = logging.getLogger(__name__)

EVENTS = (
    "delivered",
    "acked",
    "invisible_changed",
    "dead_lettered",
    "half_stored",
    "check_sent",
    "check_answered",
    "committed",
    "rolled_back",
    "parked",
    "resumed",
    "resent",
    "resent_from",
)
# Distinct keys per trace record (about 40 bytes each in KEYS, well under the property limit).
KEYS_PER_RECORD = 128
# Events waiting for the next flush; more are dropped (and counted).
MAX_BUFFERED = 200_000
# Trace records read per key: enough for a message delivered the default 17 times.
RECORDS_PER_KEY = 256

# One buffered event: key, event, time, fields.
Event = tuple[str, str, int, dict[str, Any]]


def position_key(commit_log_offset: int) -> str:
    """The trace key of consumption events of the record at ``commit_log_offset``."""
    return f"@{commit_log_offset}"


class TraceRecorder:
    """Buffers trace events and appends them to ``%TRACE%``; reads a message's events back."""

    def __init__(self, store: Store, clock: Clock, enabled: Callable[[str], bool]) -> None:
        self._store = store
        self._clock = clock
        self.enabled = enabled  # topic -> traced? (cheap: called on every traced operation)
        self._buffer: deque[Event] = deque()
        self._flush_lock = threading.Lock()
        # Events of the last flushes, until their records are surely readable (sync flush makes
        # a record visible only after its fsync): a read in between still sees them.
        self._unsettled: deque[list[Event]] = deque(maxlen=4)
        self.recorded_total = 0
        self.dropped_total = 0
        self.records_total = 0

    # -- recording (any thread) ----------------------------------------------------------
    def add(self, key: str, event: str, fields: dict[str, Any], at_ms: int | None = None) -> None:
        """Record ``event`` under ``key`` as of ``at_ms`` (default now); the caller has checked
        :attr:`enabled`."""
        if len(self._buffer) >= MAX_BUFFERED:
            self.dropped_total += 1
            return
        self._buffer.append((key, event, self._clock.now_ms() if at_ms is None else at_ms, fields))

    def record(
        self, key: str, topic: str, event: str, *, at_ms: int | None = None, **fields: Any
    ) -> None:
        """Record ``event`` under ``key`` if ``topic`` is traced: as of ``at_ms`` when the step
        happened before it could be recorded (a check counted after its answer came back)."""
        if self.enabled(topic):
            self.add(key, event, fields, at_ms)

    # -- writing (the tick thread, close) -------------------------------------------------
    def flush(self) -> int:
        """Append every buffered event to the trace topic; returns how many."""
        with self._flush_lock:
            buffer = self._buffer
            count = len(buffer)
            if not count:
                return 0
            events = [buffer.popleft() for _ in range(count)]
            records = _records(events)
            try:
                self._store.append(records)
            except Exception:
                self.dropped_total += count
                log.exception("event=trace_write_failed events=%d", count)
                return 0
            self._unsettled.append(events)
            self.recorded_total += count
            self.records_total += len(records)
            return count

    # -- reading ------------------------------------------------------------------------
    def events(self, keys: Iterable[str]) -> list[dict[str, Any]]:
        """Every event recorded under any of ``keys``, oldest first (in recording order within
        one millisecond, a check before its answer)."""
        wanted = set(keys)
        stored: list[tuple[int, int, str]] = []  # (record offset, position in it, event)
        for key in wanted:
            for record in self._store.query_by_key(TRACE_TOPIC, key, max_results=RECORDS_PER_KEY):
                try:
                    items = json.loads(record.body)
                    stored += [
                        (record.commit_log_offset, i, _encoded(e)) for i, e in enumerate(items)
                    ]
                except (ValueError, TypeError):
                    log.warning(
                        "event=trace_record_unreadable commit_log_offset=%d",
                        record.commit_log_offset,
                    )
        stored = sorted(set(stored))  # a record found under two keys counts once
        with self._flush_lock:
            recent = [e for batch in self._unsettled for e in batch] + list(self._buffer)
        recent = [e for e in recent if e[0] in wanted]
        in_store = Counter(encoded for _, _, encoded in stored)
        unwritten = Counter(_encoded(list(e)) for e in recent)
        # A recent event may be in the store already, or not yet readable: count each distinct
        # event as often as the larger of the two sources has it, in the order first seen.
        order = dict.fromkeys([encoded for _, _, encoded in stored] + list(unwritten))
        found = []
        for encoded in order:
            key, event, time_ms, fields = json.loads(encoded)
            if key in wanted:
                item = {"time_ms": time_ms, "event": event, **fields}
                found += [item] * max(in_store[encoded], unwritten[encoded])
        # Within one millisecond a check goes out before its answer, although the answer may
        # be recorded first (the check is counted once the sender returns).
        return sorted(found, key=lambda e: (e["time_ms"], e["event"] != "check_sent"))

    def stats(self) -> dict[str, int]:
        """Counters for the broker's status and metrics (``halfmoon_broker_trace_*``)."""
        return {
            "trace_events_total": self.recorded_total,
            "trace_dropped_total": self.dropped_total,
            "trace_records_total": self.records_total,
            "trace_buffered": len(self._buffer),
        }


def _encoded(item: list[Any]) -> str:
    return json.dumps(item, sort_keys=True, separators=(",", ":"))


def _records(events: list[Event]) -> list[Message]:
    """Pack events into trace records of at most KEYS_PER_RECORD distinct keys each."""
    records: list[Message] = []
    keys: dict[str, None] = {}
    items: list[list[Any]] = []
    for key, event, time_ms, fields in events:
        if key not in keys and len(keys) >= KEYS_PER_RECORD:
            records.append(_record(keys, items))
            keys, items = {}, []
        keys[key] = None
        items.append([key, event, time_ms, fields])
    if items:
        records.append(_record(keys, items))
    return records


def _record(keys: dict[str, None], items: list[list[Any]]) -> Message:
    body = json.dumps(items, separators=(",", ":")).encode()
    return Message(TRACE_TOPIC, body, 0, {PROPERTY_KEYS: KEY_SEPARATOR.join(keys)})
