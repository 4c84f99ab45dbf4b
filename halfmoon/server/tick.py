"""The broker's clock hand: ``broker.tick()`` on a thread of its own, for every process that
holds a broker (``serve``, ``broker``)."""

from __future__ import annotations

import logging
import threading

from halfmoon.broker.facade import Broker

log = logging.getLogger("halfmoon.server")


class TickThread(threading.Thread):
    """Calls ``broker.tick()`` every ``interval`` seconds; a failing tick is logged, not fatal.

    While a transaction check scan is under way (``tick()`` says True) the
    next tick follows at once: each tick works on the scan for at most its
    budget (``transaction.check_tick_budget_ms``) and then lets the delay
    timer and the periodic persistence run, so they are not starved, but the
    scan is no longer idle between ticks (it was two thirds of the time).
    """

    def __init__(self, broker: Broker, interval: float) -> None:
        super().__init__(name="halfmoon-tick", daemon=True)
        self._broker = broker
        self._interval = interval
        self._stopping = threading.Event()

    def run(self) -> None:
        failures = 0
        wait = self._interval
        while not self._stopping.wait(wait):
            more = False
            try:
                more = self._broker.tick()
                failures = 0
            except Exception:  # noqa: BLE001 - keep ticking; say so once per streak
                failures += 1
                if failures == 1 or failures % 100 == 0:
                    log.exception("event=tick_failed failures=%d", failures)
            wait = 0 if more else self._interval

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=10)
