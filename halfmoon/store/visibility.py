"""What of the written log readers and listeners may see, and when they are told.

Two per-queue tables: ``next_offsets``, the queue offset the next append to a
queue gets (the writer's, changed under the append lock), and ``visible``,
one past the last queue offset a read may return. Under ``async`` they are
one table: a record is visible once written, and its append tells the
listeners. Under ``sync`` an appended record waits in ``pending`` until the
flusher's fsync covers it; the flusher's ``on_flushed`` then advances
``visible`` and ``position`` (the end of the visible log) and tells the
listeners, so nothing is read or announced before it is durable.

The flusher is owned here because it drives visibility; a truncation stops it
and :meth:`Visibility.reset` starts a new one on the cut log.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

from halfmoon.store.api import AppendResult
from halfmoon.store.commitlog import CommitLog
from halfmoon.store.flush import GroupCommitFlusher, IntervalFlusher

log = logging.getLogger("halfmoon.store")


class Visibility:
    """The offset tables, the flusher and the listeners of one store (see the module docstring).

    ``lock`` is the store's append lock: the tables change under it.
    """

    def __init__(
        self,
        commitlog: CommitLog,
        lock: threading.Lock,
        next_offsets: dict[tuple[str, int], int],
        *,
        sync: bool,
        flush_interval: float,
    ) -> None:
        self._commitlog = commitlog
        self._lock = lock
        self._flush_interval = flush_interval
        self.sync = sync
        self.next_offsets = next_offsets
        self.visible = dict(next_offsets) if sync else next_offsets
        self.position = commitlog.write_position
        self.pending: collections.deque[AppendResult] = collections.deque()
        self._listeners: list[Callable[[AppendResult], None]] = []
        self._batch_listeners: list[Callable[[list[AppendResult]], None]] = []
        self._write_listeners: list[Callable[[], None]] = []
        self.flusher = self._start_flusher()

    def _start_flusher(self) -> GroupCommitFlusher | IntervalFlusher:
        if self.sync:
            return GroupCommitFlusher(self._commitlog, self._on_flushed)
        return IntervalFlusher(self._commitlog, self._flush_interval, self._on_flushed)

    def reset(self, next_offsets: dict[tuple[str, int], int], position: int) -> None:
        """Start over on a cut log whose end is ``position``: under the append lock, the old
        flusher closed (what was pending is gone with the cut)."""
        self.next_offsets = next_offsets
        self.visible = dict(next_offsets) if self.sync else next_offsets
        self.position = position
        self.pending.clear()
        self.flusher = self._start_flusher()

    def forget_topic(self, topic: str) -> None:
        """Drop ``topic``'s queues from both tables (under the append lock)."""
        for key in [k for k in self.next_offsets if k[0] == topic]:
            del self.next_offsets[key]
            self.visible.pop(key, None)

    # -- after an append -----------------------------------------------------

    def hold(self, results: list[AppendResult]) -> None:
        """Under the append lock: under ``sync``, keep the appended ``results`` until an fsync
        covers them."""
        if self.sync:
            self.pending.extend(results)

    def written(self, results: list[AppendResult], *, tell_writers: bool = True) -> None:
        """After the append lock is released: under ``sync`` wake the flusher (and the write
        listeners when ``tell_writers``); under ``async`` the results are visible now."""
        if self.sync:
            self.flusher.written()
            if tell_writers:
                for written in self._write_listeners:
                    written()
        else:
            self.position = self._commitlog.write_position
            if self._listeners or self._batch_listeners:
                self._notify(results)

    def _on_flushed(self, position: int) -> None:
        if not self.sync:
            return
        pending, visible, known = self.pending, self.visible, self.next_offsets
        ready = []
        # Under the append lock: the fsync may cover a record whose append is still between
        # its write and adding it to ``pending``; unlocked, that record was skipped here, then
        # durable (acknowledged) but invisible, its consumers not woken, until the next fsync.
        with self._lock:
            while pending and pending[0].end_offset <= position:
                result = pending.popleft()
                key = (result.topic, result.queue_id)
                if key in known:  # not deleted meanwhile
                    visible[key] = result.queue_offset + 1
                ready.append(result)
            self.position = position
        if ready and (self._listeners or self._batch_listeners):
            self._notify(ready)

    # -- listeners -----------------------------------------------------------

    def add_listener(self, listener: Callable[[AppendResult], None]) -> None:
        self._listeners = [*self._listeners, listener]

    def add_batch_listener(self, listener: Callable[[list[AppendResult]], None]) -> None:
        self._batch_listeners = [*self._batch_listeners, listener]

    def add_write_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after each append is written, before it is durable (under
        ``sync``; under ``async`` a write is visible at once and :meth:`add_listener`'s
        listeners are told)."""
        self._write_listeners = [*self._write_listeners, listener]

    def _notify(self, results: list[AppendResult]) -> None:
        for batch_listener in self._batch_listeners:
            try:
                batch_listener(results)
            except Exception:
                log.exception("event=listener_failed listener=%r", batch_listener)
        for listener in self._listeners:
            for result in results:
                try:
                    listener(result)
                except Exception:
                    log.exception("event=listener_failed listener=%r", listener)
