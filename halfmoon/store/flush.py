"""Flush policies: when the commit log is fsynced and who waits for it.

``GroupCommitFlusher`` (``sync``): appenders write under the store's lock,
then wait on a future for the flusher thread. The flusher loops: take the
current write position, ``fdatasync``, then complete every waiter whose end
offset is covered. All the appends that landed during one fsync share the
next one, so the fsync rate stays bounded while throughput grows with the
number of writers.

``IntervalFlusher`` (``async``): an append is acknowledged once written; a
background thread fsyncs every ``flush_interval`` seconds.

Both call ``on_flushed(position)`` from the flusher thread after each fsync;
the store uses it to make records visible under ``sync``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future

from halfmoon.store.commitlog import CommitLog

log = logging.getLogger("halfmoon.store")


def _done() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future


class GroupCommitFlusher:
    def __init__(self, commitlog: CommitLog, on_flushed: Callable[[int], None]) -> None:
        self._log = commitlog
        self._on_flushed = on_flushed
        self._cond = threading.Condition(threading.Lock())
        self._waiters: list[tuple[int, int, Future[None]]] = []
        self._sequence = itertools.count()
        self._idle = False
        self._stopping = False
        self._error: BaseException | None = None
        self.fsyncs = 0
        self._thread = threading.Thread(target=self._run, name="halfmoon-flusher", daemon=True)
        self._thread.start()

    def written(self) -> None:
        """Tell the flusher new bytes were written (cheap when it is already busy)."""
        if self._idle:
            with self._cond:
                self._cond.notify()

    def durable(self, end_offset: int) -> Future[None]:
        if end_offset <= self._log.flushed_position:
            return _done()
        future: Future[None] = Future()
        with self._cond:
            if self._error is not None:
                future.set_exception(self._error)
                return future
            if end_offset <= self._log.flushed_position:
                future.set_result(None)
                return future
            heapq.heappush(self._waiters, (end_offset, next(self._sequence), future))
            self._cond.notify()
        return future

    def wait(self, end_offset: int, timeout: float | None = None) -> bool:
        if end_offset <= self._log.flushed_position:
            return True
        try:
            self.durable(end_offset).result(timeout)
        except TimeoutError:
            return False
        return True

    def _run(self) -> None:
        cond = self._cond
        commitlog = self._log
        while True:
            with cond:
                self._idle = True
                while commitlog.write_position <= commitlog.flushed_position and not self._stopping:
                    cond.wait()
                self._idle = False
                if self._stopping and commitlog.write_position <= commitlog.flushed_position:
                    break
            try:
                flushed = commitlog.sync(commitlog.write_position)
                self.fsyncs += 1
            except BaseException as exc:  # a failing disk: fail every waiter, keep failing
                log.error("event=fsync_failed error=%r", exc)
                self._fail(exc)
                return
            self._on_flushed(flushed)
            ready = []
            with cond:
                waiters = self._waiters
                while waiters and waiters[0][0] <= flushed:
                    ready.append(heapq.heappop(waiters)[2])
            for future in ready:
                future.set_result(None)
        self._release_all()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            self._error = exc
            waiters, self._waiters = self._waiters, []
        for _end, _seq, future in waiters:
            future.set_exception(exc)

    def _release_all(self) -> None:
        with self._cond:
            waiters, self._waiters = self._waiters, []
        flushed = self._log.flushed_position
        for end, _seq, future in waiters:
            if end <= flushed:
                future.set_result(None)
            else:
                future.set_exception(RuntimeError("the store closed before the data was flushed"))

    def close(self) -> None:
        """Flush what is written, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()


class IntervalFlusher:
    def __init__(
        self, commitlog: CommitLog, interval: float, on_flushed: Callable[[int], None]
    ) -> None:
        self._log = commitlog
        self._interval = interval
        self._on_flushed = on_flushed
        self._stop = threading.Event()
        self.fsyncs = 0
        self._thread = threading.Thread(target=self._run, name="halfmoon-flusher", daemon=True)
        self._thread.start()

    def written(self) -> None:
        pass

    def durable(self, end_offset: int) -> Future[None]:
        return _done()

    def wait(self, end_offset: int, timeout: float | None = None) -> bool:
        return True

    def flush_now(self) -> None:
        if self._log.write_position > self._log.flushed_position:
            self._on_flushed(self._log.sync())
            self.fsyncs += 1

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.flush_now()
            except OSError as exc:
                log.error("event=fsync_failed error=%r", exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.flush_now()
