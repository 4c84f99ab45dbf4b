"""Waking long-polling consumers when a message arrives, without busy waiting.

A ReceiveMessage / PullMessage that finds nothing parks on a :class:`Waiter`
for its topic. The broker's arrival listener (called from store threads when
a message becomes visible, and from the tick thread for due delay messages)
hops onto the event loop with ``call_soon_threadsafe`` and resolves every
waiter of that topic. Waiters register *before* the broker is asked, so a
message that lands between "nothing there" and "wait" still wakes them: the
listener either sees the waiter or the broker call sees the message.

Listener calls for topics nobody waits on cost one dict lookup and never
touch the loop. A broker a network hop away (a proxy's) pushes arrivals only
for the topics it was asked to watch (:class:`ArrivalWatcher`): a topic is
watched from its first waiter until it has had none for
:data:`WATCH_IDLE_S`, so producers' sends cost no arrival traffic while no
consumer polls their topic. A newly watched topic gets one wake-up from the
broker when the watch lands (a message may have arrived between the
waiter's look and the watch), so no arrival is missed for it.

A listener call on the loop's own thread (a send appended on the loop) wakes
the waiters directly; calls from other threads for the same topic share one
``call_soon_threadsafe`` until the loop has run it, so a batch of 32 arrivals
costs one loop wake-up, not 32.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Protocol

log = logging.getLogger("halfmoon.server.longpoll")

# A watched topic without a waiter for this long is unwatched (looked at every WATCH_SWEEP_S).
WATCH_IDLE_S = 60.0
WATCH_SWEEP_S = 30.0


class ArrivalWatcher(Protocol):
    """A broker that pushes arrivals only for watched topics (called on the loop; never
    blocks)."""

    def watch_arrivals(self, topics: Sequence[str]) -> None: ...

    def unwatch_arrivals(self, topics: Sequence[str]) -> None: ...


class Waiter:
    __slots__ = ("_notifier", "_registered", "_timed_out", "future", "topics")

    def __init__(self, notifier: ArrivalNotifier, topics: tuple[str, ...]) -> None:
        self._notifier = notifier
        self._registered = False
        self._timed_out = False
        self.topics = topics
        self.future: asyncio.Future[None] = notifier.loop.create_future()

    async def wait(self, timeout: float) -> bool:
        """True when woken by an arrival (or shutdown), False on timeout."""
        if self.future.done():
            return True
        # The future is this waiter's own, so a timer can resolve it: cheaper than
        # wait_for + shield (a task and two extra futures per wait).
        timer = self._notifier.loop.call_later(max(0.0, timeout), self._time_out)
        try:
            await self.future
        finally:
            timer.cancel()
        return not self._timed_out

    def _time_out(self) -> None:
        if not self.future.done():
            self._timed_out = True
            self.future.set_result(None)

    def close(self) -> None:
        self._notifier._discard(self)
        if not self.future.done():
            self.future.cancel()

    def __enter__(self) -> Waiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ArrivalNotifier:
    def __init__(
        self, loop: asyncio.AbstractEventLoop, watcher: ArrivalWatcher | None = None
    ) -> None:
        self.loop = loop
        self._watcher = watcher
        # watched topic -> loop time it last had a waiter (only with a watcher)
        self._watched: dict[str, float] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._waiters: dict[str, set[Waiter]] = defaultdict(set)
        self._parked = 0
        self.shutting_down = False
        self._loop_thread: int | None = None  # learnt from the first waiter (always on the loop)
        self._pending: set[str] = set()  # topics with a wake-up scheduled from another thread
        self._pending_lock = threading.Lock()

    def parked(self) -> int:
        """How many polls are waiting (or about to) right now (metrics; any thread)."""
        return self._parked

    def waiter(self, *topics: str) -> Waiter:
        self._loop_thread = threading.get_ident()
        w = Waiter(self, topics)
        if self.shutting_down:
            w.future.set_result(None)
            return w
        for topic in topics:
            self._waiters[topic].add(w)
        if self._watcher is not None:
            self._watch(topics)
        w._registered = True
        self._parked += 1
        return w

    def _watch(self, topics: tuple[str, ...]) -> None:
        new = [topic for topic in topics if topic not in self._watched]
        now = self.loop.time()
        for topic in topics:
            self._watched[topic] = now
        if not new:
            return
        assert self._watcher is not None
        try:
            self._watcher.watch_arrivals(new)
        except Exception:  # noqa: BLE001 - the poll still ends on its timeout
            log.exception("event=watch_arrivals_failed topics=%s", new)
        if self._sweep is None:
            self._sweep = self.loop.call_later(WATCH_SWEEP_S, self._unwatch_idle)

    def _unwatch_idle(self) -> None:
        """Unwatch the topics no poll has waited on for WATCH_IDLE_S; again later while any
        topic is watched (no timer runs on a proxy nobody consumes through)."""
        self._sweep = None
        now = self.loop.time()
        for topic in self._waiters:
            self._watched[topic] = now
        idle = [t for t, seen in self._watched.items() if now - seen >= WATCH_IDLE_S]
        for topic in idle:
            del self._watched[topic]
        if idle and self._watcher is not None:
            try:
                self._watcher.unwatch_arrivals(idle)
            except Exception:  # noqa: BLE001 - more arrivals than needed, nothing lost
                log.exception("event=unwatch_arrivals_failed")
        if self._watched and not self.shutting_down:
            self._sweep = self.loop.call_later(WATCH_SWEEP_S, self._unwatch_idle)

    def _discard(self, w: Waiter) -> None:
        if not w._registered:
            return
        w._registered = False
        self._parked -= 1
        for topic in w.topics:
            waiting = self._waiters.get(topic)
            if waiting is not None:
                waiting.discard(w)
                if not waiting:
                    del self._waiters[topic]
                    if topic in self._watched:
                        self._watched[topic] = self.loop.time()

    def on_arrival(self, topic: str, queue_id: int = -1) -> None:
        """Broker arrival listener: any thread, must be quick, must not raise."""
        if topic not in self._waiters:
            return
        if threading.get_ident() == self._loop_thread:
            self._wake(topic)
            return
        with self._pending_lock:
            if topic in self._pending:
                return  # a wake-up for it is scheduled and has not run yet
            self._pending.add(topic)
            schedule = len(self._pending) == 1
        if schedule:
            # A closed loop (shutdown) means nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._wake_pending)

    def _wake_pending(self) -> None:
        with self._pending_lock:
            topics, self._pending = self._pending, set()
        for topic in topics:
            self._wake(topic)

    def wake(self, topic: str) -> None:
        """Loop thread: make every poll of ``topic`` look again (e.g. a redelivery time moved)."""
        self._wake(topic)

    def _wake(self, topic: str) -> None:
        for w in self._waiters.pop(topic, ()):
            if not w.future.done():
                w.future.set_result(None)

    def wake_all(self) -> None:
        """Shutdown: every parked poll returns now with what it has (nothing)."""
        self.shutting_down = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for topic in list(self._waiters):
            self._wake(topic)
