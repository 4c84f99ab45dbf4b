"""The check service: ask a live producer about every transaction left open.

Algorithm (driven by :meth:`CheckService.tick`, which the broker calls every
~100 ms with its clock's time; only the per-tick work budget is real time):

1. Once every ``transaction.check_interval_ms`` (default 30 s; the first scan
   one interval after the broker opens), take the list of half messages that
   are PREPARED, not members of a transaction group (their group decides),
   and due: stored more than ``transaction.timeout_ms`` ago (default 6 s), or
   more than their check immunity ago when the producer gave one
   (``orphaned_transaction_recovery_duration``, capped at
   ``transaction.max_immunity_ms``, default 1 h).
2. For each, in order, each one in its own ``try`` (an error is logged and
   counted and the scan goes on: RocketMQ's scan stalls on one bad message,
   its issue 9500):
   a. re-read its state: a decision that arrived since the list was taken
      wins, and a decided transaction is never checked again (RocketMQ
      checks committed messages when its op queue lags: issues 1517, 8158);
   b. if it already got ``transaction.check_max`` checks (default 15), park
      it: copy it to ``TRANS_CHECK_MAX_TIME_TOPIC``, record ``parked``, log
      it; an operator lists, decides or resumes it;
   c. otherwise hand it to the :class:`CheckSender`, which sends a
      RecoverOrphanedTransactionCommand to one live producer stream of its
      producer group (round robin, dead streams skipped). Only when a stream
      took it does the check count (RocketMQ counts checks it never
      delivered: issue 1694); when no producer is live it is simply tried
      again next round.
3. Buffered check counts are appended to the op topic after each tick's
   share of the work, so a restart keeps them.

A scan shares the broker's tick thread with the delay timer: each tick works
on it for at most ``transaction.check_tick_budget_ms`` (default 50 ms of real
time, at least one message) and the scan carries on at the next tick; a new
scan starts only once the previous one is done. The due time used is the one
of the tick that started the scan.

A producer's answer arrives later as an EndTransaction with source "check"
and goes through the same transition table as any decision.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from halfmoon.broker.message import MessageView
from halfmoon.broker.transactions.config import TransactionConfig
from halfmoon.broker.transactions.service import TransactionService
from halfmoon.errors import NotFound

log = logging.getLogger(__name__)


class CheckSender(Protocol):
    def send_check(
        self, producer_group: str | None, topic: str, message: MessageView, transaction_id: str
    ) -> bool:
        """Send a check to one live producer; True only if a live stream took it.

        ``producer_group`` is the half message's (None when the producer sent
        none: pick any live producer of ``topic``). Must not block for long;
        may raise (logged, counted, the scan goes on).
        """


@dataclass
class ScanReport:
    candidates: int = 0
    sent: int = 0
    unsent: int = 0  # no live producer: retried next round, not counted
    parked: int = 0
    skipped: int = 0  # decided (or no longer due) by the time its turn came
    errors: int = 0
    elapsed_ms: int = 0


class CheckService:
    def __init__(self, service: TransactionService, config: TransactionConfig, start_ms: int) -> None:
        self._service = service
        self._config = config
        self._sender: CheckSender | None = None
        self._next_scan_ms = start_ms + config.check_interval_ms
        self._lock = threading.Lock()
        self._todo: collections.deque[int] = collections.deque()  # the current scan's remaining work
        self._report: ScanReport | None = None
        self._scan_now_ms = 0
        self._started = 0.0
        self.last_report: ScanReport | None = None

    def set_sender(self, sender: CheckSender | None) -> None:
        self._sender = sender

    @property
    def scanning(self) -> bool:
        """True while a scan is spread over several ticks."""
        return self._report is not None

    def tick(self, now_ms: int) -> ScanReport | None:
        """Start a scan when an interval has passed; work on it for at most the tick budget.

        Returns the report of a scan that finished during this tick, else None.
        """
        with self._lock:
            if self._report is None:
                if now_ms < self._next_scan_ms:
                    return None
                self._next_scan_ms = now_ms + self._config.check_interval_ms
                self._begin(now_ms)
            return self._work(time.monotonic() + self._config.check_tick_budget_ms / 1000)

    def scan(self, now_ms: int) -> ScanReport:
        """One whole pass over the due transactions now (finishing any scan under way first)."""
        with self._lock:
            if self._report is not None:
                self._work(None)
            self._begin(now_ms)
            report = self._work(None)
            assert report is not None
            return report

    def _begin(self, now_ms: int) -> None:
        self._scan_now_ms = now_ms
        self._started = time.monotonic()
        self._todo.extend(self._service.check_candidates(now_ms))
        self._report = ScanReport(candidates=len(self._todo))

    def _work(self, deadline: float | None) -> ScanReport | None:
        service, report, todo = self._service, self._report, self._todo
        assert report is not None
        while todo:
            half_offset = todo.popleft()
            try:
                self._check_one(half_offset, self._scan_now_ms, report)
            except Exception:
                report.errors += 1
                service.counters.check_errors_total += 1
                log.exception("event=check_failed half_offset=%d", half_offset)
            if deadline is not None and time.monotonic() >= deadline:
                break  # the tick thread has other work: carry on at the next tick
        try:
            service.flush_ops()
        except Exception:
            log.exception("event=check_counts_not_saved")
        if todo:
            return None
        report.elapsed_ms = int((time.monotonic() - self._started) * 1000)
        self._report = None
        self.last_report = report
        if report.candidates:
            log.info(
                "event=check_scan candidates=%d sent=%d unsent=%d parked=%d skipped=%d errors=%d elapsed_ms=%d",
                report.candidates, report.sent, report.unsent, report.parked, report.skipped,
                report.errors, report.elapsed_ms,
            )  # fmt: skip
        return report

    def _check_one(self, half_offset: int, now_ms: int, report: ScanReport) -> None:
        service = self._service
        entry = service.checkable(half_offset, now_ms)
        if entry is None:
            report.skipped += 1
            return
        if entry.checks >= self._config.check_max:
            if service.park(half_offset):
                report.parked += 1
            else:
                report.skipped += 1
            return
        try:
            view = service.check_view(entry)
        except NotFound:  # retention removed the half record: nothing left to ask about or publish
            service.forget_lost(half_offset)
            report.errors += 1
            return
        sender = self._sender
        # The last look before asking: a decision may have landed while we read the message.
        if service.checkable(half_offset, now_ms) is None:
            report.skipped += 1
            return
        if sender is None or not sender.send_check(entry.producer_group, entry.topic, view, entry.transaction_id):
            report.unsent += 1
            service.counters.checks_unsent_total += 1
            return
        if service.record_check(half_offset, now_ms) is None:
            report.skipped += 1  # decided while the check was on its way: nothing to count
        else:
            report.sent += 1
