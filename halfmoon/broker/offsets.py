"""Committed offsets of pull consumers, per (group, topic, queue id).

Kept in memory, written to ``<metadata_dir>/offsets.json`` (atomically) when
changed, at most every ``persist_interval_ms`` by :meth:`OffsetTable.maybe_persist`
and on close. After a crash a pull consumer may therefore resume up to one
interval behind what it committed: it sees those messages again
(at-least-once), never skips any.

With a journal (:mod:`offset_journal`: broker groups) every change is also
appended to the commit log under the table's lock, and :meth:`set` returns once
that record is acknowledged; the snapshot records how much of the journal it
holds, and opening the table replays the rest. Nothing committed is then lost
to a crash, and the offsets reach replicas with the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from halfmoon.broker.config import read_json, write_json_atomic
from halfmoon.broker.offset_journal import FULL_EVERY_RECORDS, FULL_EVERY_S, OffsetJournal

Key = tuple[str, str, int]

log = logging.getLogger(__name__)


class OffsetTable:
    FILE = "offsets.json"

    def __init__(
        self,
        metadata_dir: Path | None,
        persist_interval_ms: int = 5_000,
        journal: OffsetJournal | None = None,
    ) -> None:
        self._path = metadata_dir / self.FILE if metadata_dir is not None else None
        self._interval = persist_interval_ms
        self._lock = threading.Lock()
        self._offsets: dict[Key, int] = {}
        self._dirty = False
        self._last_persist_ms: int | None = None
        self._journal = journal
        self._since_full = 0  # journal records since the last full one
        self._last_full = 0.0  # time.monotonic() of the last full record (0: none yet)
        snapshot = (read_json(self._path) or {}) if self._path is not None else {}
        if journal is not None and int(snapshot.get("journal_offset", 0)) > journal.end:
            # The snapshot holds records this log does not (a tail lost to a crash under an
            # async flush, or cut when a deposed master rejoined): the log is the truth.
            log.warning(
                "event=offsets_snapshot_ahead_of_log journal_offset=%s end=%d",
                snapshot.get("journal_offset"), journal.end,
            )  # fmt: skip
            snapshot = {}
        for item in snapshot.get("offsets", []):
            self._offsets[(item["group"], item["topic"], int(item["queue_id"]))] = int(
                item["offset"]
            )
        if journal is not None:
            replayed_to = journal.replay(
                int(snapshot.get("journal_offset", 0)),
                self._replay_set,
                self._forget_held,
                self._offsets.clear,
            )
            self._dirty = replayed_to > int(snapshot.get("journal_offset", 0))

    def _replay_set(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._offsets[(group, topic, queue_id)] = offset

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._offsets.get((group, topic, queue_id))

    def set(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        end = 0
        with self._lock:
            self._offsets[(group, topic, queue_id)] = offset
            self._dirty = True
            if self._journal is not None:
                end = self._journal.record_set(group, topic, queue_id, offset)
                self._since_full += 1
        if self._journal is not None:
            self._journal.wait(end)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the table still: a transactional commit checks and sets offsets under it."""
        with self._lock:
            yield

    def set_held(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """:meth:`set` for a caller inside :meth:`held` (its journal record becomes durable
        with the caller's own writes: a transaction's decision)."""
        self._offsets[(group, topic, queue_id)] = offset
        self._dirty = True
        if self._journal is not None:
            self._journal.record_set(group, topic, queue_id, offset)
            self._since_full += 1

    def of_group(self, group: str, topic: str | None = None) -> dict[tuple[str, int], int]:
        with self._lock:
            return {
                (t, q): o
                for (g, t, q), o in self._offsets.items()
                if g == group and (topic is None or t == topic)
            }

    def forget(self, *, group: str | None = None, topic: str | None = None) -> None:
        with self._lock:
            if self._forget_held(group, topic) and self._journal is not None:
                self._journal.record_forget(group, topic)
                self._since_full += 1

    def _write_full_if_due(self) -> None:
        """Append the whole table to the journal when enough records or time went by
        (``offset_journal``: what keeps retention from aging offsets out). Lock held."""
        assert self._journal is not None
        due = (
            not self._last_full  # the first since this table opened
            or self._since_full >= max(FULL_EVERY_RECORDS, 2 * len(self._offsets))
            or time.monotonic() - self._last_full >= FULL_EVERY_S  # even if nothing changed
        )
        if due:
            self._journal.record_full(dict(self._offsets))
            self._since_full = 0
            self._last_full = time.monotonic()

    def _forget_held(self, group: str | None, topic: str | None) -> bool:
        keys = [
            k
            for k in self._offsets
            if (group is None or k[0] == group) and (topic is None or k[1] == topic)
        ]
        for key in keys:
            del self._offsets[key]
            self._dirty = True
        return bool(keys)

    def maybe_persist(self, now_ms: int) -> bool:
        """Persist if changed and the interval has passed; True if written."""
        if self._last_persist_ms is None:
            self._last_persist_ms = now_ms
        if not self._dirty or now_ms - self._last_persist_ms < self._interval:
            return False
        self._last_persist_ms = now_ms
        self.persist()
        return True

    def persist(self) -> None:
        with self._lock:
            if self._path is None:
                self._dirty = False
                return
            items = [
                {"group": g, "topic": t, "queue_id": q, "offset": o}
                for (g, t, q), o in sorted(self._offsets.items())
            ]
            self._dirty = False
            if self._journal is not None:
                self._write_full_if_due()
            snapshot: dict[str, object] = {"version": 1, "offsets": items}
            if self._journal is not None:  # every record below this one is in ``items``
                snapshot["journal_offset"] = self._journal.end
            write_json_atomic(self._path, snapshot)
