"""Flush policies: when the commit log is fsynced and who waits for it.

``GroupCommitFlusher`` (``sync``): appenders write under the store's lock,
then wait on the future of the fsync that will cover them. The flusher
loops: take the current write position, ``fdatasync``, make the records
visible, then hand the fsync's one shared future to a notifier thread that
wakes its waiters while the flusher is already in the next fsync. All the
appends that landed during one fsync share the next one (and the writers
the last fsync released get a brief chance to join it), so the fsync rate
stays bounded while throughput grows with the number of writers.

``IntervalFlusher`` (``async``): an append is acknowledged once written; a
background thread fsyncs every ``flush_interval`` seconds.

Both call ``on_flushed(position)`` from the flusher thread after each fsync;
the store uses it to make records visible under ``sync``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from halfmoon.store.commitlog import CommitLog

log = logging.getLogger("halfmoon.store")


def _done() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future


# The longest an fsync is held back for released writers to join it (see _gather).
_MAX_GATHER_SECONDS = 0.005

# Returned whenever the bytes asked about are already durable. A finished
# future can be shared: it cannot be cancelled and its callbacks run at once.
_DONE = _done()


def _batch() -> Future[None]:
    """The future all the waiters of one fsync share.

    Marked running, so that one waiter cancelling it (an asyncio task wrapping
    it is cancelled) cannot cancel it for the others.
    """
    future: Future[None] = Future()
    future.set_running_or_notify_cancel()
    return future


class GroupCommitFlusher:
    """Group commit: one fsync at a time, each covering everything written before it started.

    Waiters do not get a future each: every waiter of the same fsync shares
    one (``_next`` until that fsync starts, then ``_in_flight``), so
    completing an fsync is one ``set_result``, one wake-up of all its
    waiters, however many there are. A waiter whose bytes the running fsync
    already covers joins it instead of waiting for the next one.
    """

    def __init__(self, commitlog: CommitLog, on_flushed: Callable[[int], None]) -> None:
        self._log = commitlog
        self._on_flushed = on_flushed
        self._cond = threading.Condition(threading.Lock())
        self._next: Future[None] | None = None  # completes after the next fsync to start
        self._in_flight: Future[None] | None = None  # completes after the running fsync
        self._in_flight_end = -1  # the running fsync covers bytes below this
        self._next_waiters = 0  # waiters of the next batch, of the running one
        self._in_flight_waiters = 0
        # Waiters the last fsync released that have not registered again yet
        # (see _gather), and how long the last fsync took.
        self._owed = 0
        self._gathering = False
        self._last_fsync = 0.0
        self._beyond: list[tuple[int, Future[None]]] = []  # waiters for bytes not yet written
        # Durable and visible (on_flushed has run) below this: the waiters' fast path.
        self._done = commitlog.flushed_position
        self._idle = False
        self._stopping = False
        self._stopped = False
        self._error: BaseException | None = None
        self.fsyncs = 0
        self._completed: queue.SimpleQueue[Future[None] | None] = queue.SimpleQueue()
        self._notifier = threading.Thread(
            target=self._notify_loop, name="halfmoon-flush-notifier", daemon=True
        )
        self._notifier.start()
        self._thread = threading.Thread(target=self._run, name="halfmoon-flusher", daemon=True)
        self._thread.start()

    def _notify_loop(self) -> None:
        while (batch := self._completed.get()) is not None:
            batch.set_result(None)

    def written(self) -> None:
        """Tell the flusher new bytes were written (cheap when it is already busy)."""
        if self._idle:
            with self._cond:
                self._cond.notify()

    def durable(self, end_offset: int) -> Future[None]:
        if end_offset <= self._done:
            return _DONE
        with self._cond:
            if self._error is not None:
                failed: Future[None] = Future()
                failed.set_exception(self._error)
                return failed
            if end_offset <= self._done:
                return _DONE
            if end_offset <= self._in_flight_end and self._in_flight is not None:
                self._in_flight_waiters += 1
                return self._in_flight
            if self._stopped:
                closed: Future[None] = Future()
                closed.set_exception(RuntimeError("the store closed before the data was flushed"))
                return closed
            if end_offset > self._log.write_position:
                # Not written yet (callers normally pass an AppendResult's end):
                # the next fsync may not cover it, so it waits on its own.
                future: Future[None] = Future()
                self._beyond.append((end_offset, future))
                return future
            batch = self._next
            if batch is None:
                batch = self._next = _batch()
            self._next_waiters += 1
            if self._owed:
                self._owed -= 1
                if not self._owed and self._gathering:
                    self._cond.notify()
            if self._idle:
                self._cond.notify()
            return batch

    def wait(self, end_offset: int, timeout: float | None = None) -> bool:
        if end_offset <= self._done:
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
                self._gather()
                # Everything written so far is in this fsync; so is every waiter
                # registered so far (a waiter registers after its write).
                target = commitlog.write_position
                batch, self._next = self._next, None
                if batch is None:
                    batch = _batch()  # for waiters arriving during the fsync that it covers
                self._in_flight, self._in_flight_end = batch, target
                self._in_flight_waiters, self._next_waiters = self._next_waiters, 0
            try:
                started = time.monotonic()
                flushed = commitlog.sync(target)
                self._last_fsync = time.monotonic() - started
                self.fsyncs += 1
            except BaseException as exc:  # a failing disk: fail every waiter, keep failing
                log.error("event=fsync_failed error=%r", exc)
                self._fail(exc)
                return
            self._on_flushed(flushed)  # visible before acknowledged
            with cond:
                self._done = flushed
                self._in_flight, self._in_flight_end = None, -1
                self._owed, self._in_flight_waiters = self._in_flight_waiters, 0
                ready = []
                if self._beyond:
                    ready = [f for end, f in self._beyond if end <= flushed]
                    self._beyond = [(end, f) for end, f in self._beyond if end > flushed]
            # Waking the waiters costs a system call per waiter; the notifier
            # thread does it while this one is already in the next fsync.
            self._completed.put(batch)
            for future in ready:
                future.set_result(None)
        self._release_all()

    def _gather(self) -> None:
        """Hold the next fsync briefly for the writers the last one released (cond held).

        Writers released by an fsync append again and register while the next
        fsync is already running, so without this they miss it and the
        writers split into two groups taking turns, each fsync covering half
        of them. When fsyncs are slow compared with an append, it pays to let
        the released writers join: the wait ends as soon as all of them have
        registered, and after at most half the last fsync's duration (capped),
        so a lone writer is never held and a writer that stopped costs one
        short wait.
        """
        if not self._owed or self._stopping:
            return
        deadline = time.monotonic() + min(self._last_fsync / 2, _MAX_GATHER_SECONDS)
        self._gathering = True
        try:
            while self._owed and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
        finally:
            self._gathering = False
            self._owed = 0  # whoever is not back yet waits for the fsync after this one

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            self._error = exc
            batches = [self._in_flight, self._next, *(f for _end, f in self._beyond)]
            self._in_flight, self._next, self._in_flight_end = None, None, -1
            self._beyond = []
        for batch in batches:
            if batch is not None:
                batch.set_exception(exc)

    def _release_all(self) -> None:
        with self._cond:
            self._stopped = True
            batch, self._next = self._next, None
            flushed = self._log.flushed_position
            self._done = max(self._done, flushed)
            beyond, self._beyond = self._beyond, []
        closed = RuntimeError("the store closed before the data was flushed")
        for end, future in beyond:
            if end <= flushed:
                future.set_result(None)
            else:
                future.set_exception(closed)
        if batch is not None:
            # A waiter registers after its write, and the loop only ends once
            # everything written is flushed: normally every waiter is covered.
            if self._log.write_position <= flushed:
                batch.set_result(None)
            else:
                batch.set_exception(closed)

    def close(self) -> None:
        """Flush what is written, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        self._completed.put(None)
        self._notifier.join()


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
        return _DONE  # acknowledged once written: nothing to wait for, nothing to allocate

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
