"""The life of a halfmoon process, one shape for ``serve``, ``broker`` and ``proxy``.

startup -> serve -> drain with a deadline -> cancel what is left, and say how much:

- the stop signals are captured once for the whole life (:meth:`Lifecycle.capture_signals`,
  on the event loop or in the main thread), and restored when it ends; the first stop
  request drains, a second forces (:mod:`halfmoon.shutdown_signals` tells a second request
  from a copy of the first);
- the drain (:meth:`Lifecycle.drain`, :meth:`Lifecycle.drain_async`) waits for what is in
  flight to finish, for at most ``server.shutdown_grace``; at the deadline, or at once on a
  second request, it cancels what is left and logs how many calls that cut short
  (``event=shutdown_deadline`` or ``event=shutdown_forced``, with ``calls_cancelled``).

What counts as in flight is the server's business: :class:`CallsInFlight` counts the calls
its handlers are running. uvicorn's ``Server`` (``capture_signals``, then a shutdown that
cancels the tasks left after ``timeout_graceful_shutdown`` and says how many) is the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import uvloop

from halfmoon.shutdown_signals import StopRequests, install_in_main_thread, install_on_loop

log = logging.getLogger("halfmoon.shutdown")

T = TypeVar("T")

POLL_S = 0.1
"""How often a blocking drain looks for a second stop request while it waits."""


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run a server process's main coroutine to its end, on uvloop.

    A server's loop is woken from other threads all the time (a flush's completion, a
    worker thread's answer, the tick) and reads and writes small frames on many sockets;
    uvloop does both in C: measured on the AMQP endpoint, 10-20 % less server CPU per
    message where the loop's own work is a large part of it, latency and throughput within
    the measurements' spread (docs/benchmarks.md, "The event loop: uvloop").
    """
    return uvloop.run(main)


class CallsInFlight:
    """How many calls a server's handlers are running: what a drain waits for and what a
    cancel cuts short. Safe from any thread."""

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._count

    def enter(self) -> None:
        with self._lock:
            self._count += 1

    def leave(self) -> None:
        with self._lock:
            self._count -= 1

    def counting(self, behaviour: Callable[..., T]) -> Callable[..., T]:
        """``behaviour`` (a blocking handler), counted while it runs."""

        def run(*args: Any) -> T:
            self.enter()
            try:
                return behaviour(*args)
            finally:
                self.leave()

        return run

    def counting_stream(self, behaviour: Callable[..., Iterator[T]]) -> Callable[..., Iterator[T]]:
        """``behaviour`` (a blocking handler that answers with a stream), counted until its
        stream ends."""

        def run(*args: Any) -> Iterator[T]:
            self.enter()
            try:
                yield from behaviour(*args)
            finally:
                self.leave()

        return run


class Lifecycle:
    """One process life's stop requests and its drain.

    ``stop``: the event a stop request sets (given by an embedding caller, which may also
    set it itself); ``on_stop`` and ``on_force`` are called on the first request and on a
    second one; ``on_reload`` on SIGHUP. ``grace_s`` bounds the drain."""

    def __init__(
        self,
        grace_s: float,
        *,
        stop: threading.Event | None = None,
        on_stop: Callable[[], object] | None = None,
        on_force: Callable[[], object] | None = None,
        on_reload: Callable[[], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.grace_s = grace_s
        self.stopping = stop or threading.Event()
        self.forced = threading.Event()
        self._on_stop = on_stop
        self._on_force: list[Callable[[], object]] = [] if on_force is None else [on_force]
        self._on_reload = on_reload
        self._clock = clock
        self._requests = StopRequests(self.request_stop, self.force, clock=clock)
        self._captured = False

    def request_stop(self) -> None:
        """Begin the drain (what the first SIGTERM/SIGINT does)."""
        self.stopping.set()
        if self._on_stop is not None:
            self._on_stop()

    def force(self) -> None:
        """Cut the drain short (what a second stop request does)."""
        self.stopping.set()
        self.forced.set()
        for each in list(self._on_force):
            each()

    @contextlib.contextmanager
    def capture_signals(self, loop: asyncio.AbstractEventLoop | None = None) -> Iterator[None]:
        """The stop signals (and SIGHUP) routed to this life while the block runs: through
        ``loop`` when given, else to Python handlers in the main thread (off it, nothing is
        installed: an embedding caller stops the life with ``stop``). Once per life."""
        if self._captured:
            raise RuntimeError("a process life captures its signals once")
        self._captured = True
        if loop is not None:
            undo = install_on_loop(loop, self._requests, self._on_reload)
        else:
            undo = install_in_main_thread(self._requests, self._on_reload)
        try:
            yield
        finally:
            undo()

    def shutdown_begins(self, grace_s: float | None = None, detail: str = "") -> None:
        log.info(
            "event=shutdown_begin grace_s=%s%s",
            self.grace_s if grace_s is None else grace_s, detail,
        )  # fmt: skip

    def drain(
        self,
        finished: Callable[[float], bool],
        in_flight: Callable[[], int],
        cancel: Callable[[], object],
        *,
        grace_s: float | None = None,
    ) -> int:
        """Wait, blocking, until ``finished(timeout)`` says the calls in flight are done, for
        at most the grace; then ``cancel`` what is left. How many calls it cancelled."""
        grace = self.grace_s if grace_s is None else grace_s
        started = self._clock()
        deadline = started + grace
        while not self.forced.is_set():
            remaining = deadline - self._clock()
            if finished(max(0.0, min(remaining, POLL_S))):
                return self._drained(started)
            if remaining <= 0:
                break
        return self._cancel(in_flight(), grace, cancel)

    async def drain_async(
        self,
        finished: Awaitable[object],
        in_flight: Callable[[], int],
        cancel: Callable[[], Awaitable[object]],
        *,
        grace_s: float | None = None,
    ) -> int:
        """:meth:`drain` on an event loop: wait for ``finished`` for at most the grace, or
        until a second request; then await ``cancel()``. How many calls it cancelled."""
        grace = self.grace_s if grace_s is None else grace_s
        loop = asyncio.get_running_loop()
        started = self._clock()
        done = asyncio.ensure_future(finished)
        forced = loop.create_future()

        def settle() -> None:
            if not forced.done():
                forced.set_result(None)

        def wake() -> None:
            loop.call_soon_threadsafe(settle)

        self._on_force.append(wake)
        if self.forced.is_set():
            wake()
        try:
            await asyncio.wait({done, forced}, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._on_force.remove(wake)
            forced.cancel()
        if done.done() and not self.forced.is_set():
            return self._drained(started)
        left = self._cancel(in_flight(), grace, lambda: None)
        await cancel()
        with contextlib.suppress(Exception):
            await done
        return left

    def _drained(self, started: float) -> int:
        log.info("event=drained elapsed_ms=%d", (self._clock() - started) * 1000)
        return 0

    def _cancel(self, left: int, grace: float, cancel: Callable[[], object]) -> int:
        if self.forced.is_set():
            log.warning("event=shutdown_forced calls_cancelled=%d", left)
        else:
            log.warning("event=shutdown_deadline grace_s=%s calls_cancelled=%d", grace, left)
        cancel()
        return left
