"""Committed offsets of pull consumers, per (group, topic, queue id).

Kept in memory, written to ``<metadata_dir>/offsets.json`` (atomically) when
changed, at most every ``persist_interval_ms`` by :meth:`OffsetTable.maybe_persist`
and on close. After a crash a pull consumer may therefore resume up to one
interval behind what it committed: it sees those messages again
(at-least-once), never skips any.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from halfmoon.broker.config import read_json, write_json_atomic

Key = tuple[str, str, int]


class OffsetTable:
    FILE = "offsets.json"

    def __init__(self, metadata_dir: Path | None, persist_interval_ms: int = 5_000) -> None:
        self._path = metadata_dir / self.FILE if metadata_dir is not None else None
        self._interval = persist_interval_ms
        self._lock = threading.Lock()
        self._offsets: dict[Key, int] = {}
        self._dirty = False
        self._last_persist_ms: int | None = None
        if self._path is not None:
            for item in (read_json(self._path) or {}).get("offsets", []):
                self._offsets[(item["group"], item["topic"], int(item["queue_id"]))] = int(
                    item["offset"]
                )

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._offsets.get((group, topic, queue_id))

    def set(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            self._offsets[(group, topic, queue_id)] = offset
            self._dirty = True

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the table still: a transactional commit checks and sets offsets under it."""
        with self._lock:
            yield

    def set_held(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """:meth:`set` for a caller inside :meth:`held`."""
        self._offsets[(group, topic, queue_id)] = offset
        self._dirty = True

    def of_group(self, group: str, topic: str | None = None) -> dict[tuple[str, int], int]:
        with self._lock:
            return {
                (t, q): o
                for (g, t, q), o in self._offsets.items()
                if g == group and (topic is None or t == topic)
            }

    def forget(self, *, group: str | None = None, topic: str | None = None) -> None:
        with self._lock:
            for key in [
                k
                for k in self._offsets
                if (group is None or k[0] == group) and (topic is None or k[1] == topic)
            ]:
                del self._offsets[key]
                self._dirty = True

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
            write_json_atomic(self._path, {"version": 1, "offsets": items})
