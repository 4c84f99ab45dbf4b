"""Stop signals, the same in ``serve``, ``broker`` and ``proxy``: the first drains, a second
one forces, and copies of one request are one request.

A request to stop reaches a process as SIGTERM or SIGINT, often more than once: GNU
``timeout`` signals its child and then the child's process group, Ctrl-C and systemd's
default ``KillMode=control-group`` signal every process of the group, and a proxy's
supervisor passes its own signal on to workers the group signal reached already. So:

- the first SIGTERM/SIGINT is logged (``event=signal … action=shutdown``) and starts the
  drain;
- a signal that arrives within :data:`REPEAT_WINDOW_S` of the first one's report is a copy
  of it (``event=signal_repeat … action=none``): no operator reads the line and answers in
  that time;
- a supervisor's copy comes as :data:`SUPERVISOR_STOP` (SIGUSR1) and is counted apart from
  the signals the process got itself: a worker forces only when one source asked twice, so
  the group's SIGTERM and the supervisor's copy of it are one request, and a supervisor
  forwards only what it decided (a drain, then a force), never every copy it got;
- any later second request forces (``event=signal_again … action=force``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import threading
import time
from asyncio import AbstractEventLoop
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("halfmoon.shutdown")

REPEAT_WINDOW_S = 0.5
"""A signal this soon after the first one was reported is a copy of it, not a second one."""

SUPERVISOR_STOP = signal.SIGUSR1
_PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends


def stop_with_supervisor(supervisor: int) -> None:
    """Have the kernel send this worker :data:`SUPERVISOR_STOP` when its supervising parent
    ``supervisor`` ends, however it ended (Linux's ``PR_SET_PDEATHSIG``): a supervisor
    SIGKILLed must not leave its workers serving on as orphans that no stop request reaches.
    A parent gone before the request took effect is stopped for at once."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return  # not Linux: a supervisor's end is not told
    if prctl(_PR_SET_PDEATHSIG, int(SUPERVISOR_STOP), 0, 0, 0) != 0:
        log.warning("event=parent_death_signal_unset errno=%d", ctypes.get_errno())
        return
    if os.getppid() != supervisor:
        os.kill(os.getpid(), SUPERVISOR_STOP)


"""What a supervisor sends its workers for each stop request it decided (drain, then force)."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, SUPERVISOR_STOP)

_Handler = Callable[[int, FrameType | None], object] | int | None


class StopRequests:
    """Turns stop signals into at most two calls: ``on_stop`` (drain), then ``on_force``."""

    def __init__(
        self,
        on_stop: Callable[[], object],
        on_force: Callable[[], object],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_stop = on_stop
        self._on_force = on_force
        self._clock = clock
        self._counts = {"signal": 0, "supervisor": 0}
        self._reported_at: float | None = None
        self._forced = False

    @property
    def stopping(self) -> bool:
        return self._reported_at is not None

    def received(self, signum: int) -> str:
        """Handle one signal; what it did: ``shutdown``, ``force`` or ``none``."""
        name = signal.Signals(signum).name
        source = "supervisor" if signum == SUPERVISOR_STOP else "signal"
        if self._reported_at is None:
            self._counts[source] = 1
            log.info("event=signal signal=%s source=%s action=shutdown", name, source)
            self._reported_at = self._clock()
            self._on_stop()
            return "shutdown"
        if self._forced:
            log.info("event=signal_repeat signal=%s source=%s action=none", name, source)
            return "none"
        if source == "signal" and self._clock() - self._reported_at < REPEAT_WINDOW_S:
            log.info(
                "event=signal_repeat signal=%s source=%s action=none reason=same_request",
                name, source,
            )  # fmt: skip
            return "none"
        self._counts[source] += 1
        if self._counts[source] < 2:  # the other source's copy of the request already had
            log.info(
                "event=signal_repeat signal=%s source=%s action=none reason=copy", name, source
            )
            return "none"
        self._forced = True
        log.warning("event=signal_again signal=%s source=%s action=force", name, source)
        self._on_force()
        return "force"


def install_on_loop(
    loop: AbstractEventLoop, requests: StopRequests, on_reload: Callable[[], object] | None
) -> Callable[[], None]:
    """Route the stop signals (and SIGHUP to ``on_reload``) through ``loop``; the undo."""
    signums: list[int] = []
    for signum in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, requests.received, signum)
            signums.append(signum)
    if on_reload is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, on_reload)
            signums.append(signal.SIGHUP)

    def remove() -> None:
        for each in signums:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(each)
        # What is left (closing the broker and the store) must not die of a signal's default
        # action: a request to stop while stopping is logged, nothing more. (SIGINT is left
        # to Python's KeyboardInterrupt, as a host program such as a test runner expects.)
        if threading.current_thread() is threading.main_thread():
            for each in (signal.SIGTERM, SUPERVISOR_STOP):
                signal.signal(each, lambda number, _frame: requests.received(number))

    return remove


def install_in_main_thread(
    requests: StopRequests, on_reload: Callable[[], object] | None
) -> Callable[[], None]:
    """Route the stop signals (and SIGHUP to ``on_reload``) to Python handlers; the undo.
    Off the main thread (embedded in a test) nothing is installed: the caller stops it."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous: dict[int, _Handler] = {}
    for signum in STOP_SIGNALS:
        previous[signum] = signal.signal(signum, lambda number, _frame: requests.received(number))
    if on_reload is not None:
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda _s, _f: on_reload())

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    return restore
