"""The check service: ask a live producer about every transaction left open.

Algorithm (driven by :meth:`CheckService.tick`, which the broker's tick thread
calls with its clock's time, every ``server.tick_interval`` (100 ms) and at
once again while a scan is unfinished; only the per-tick work budget is real
time):

1. Once every ``transaction.check_interval_ms`` (default 30 s; the first scan
   one interval after the broker opens), take the list of half messages that
   are PREPARED, not members of a transaction group (their group decides),
   due (stored more than ``transaction.timeout_ms`` ago, default 6 s, or
   more than their check immunity ago when the producer gave one:
   ``orphaned_transaction_recovery_duration``, capped at
   ``transaction.max_immunity_ms``, default 1 h), and whose last counted
   check, if any, is at least ``transaction.check_retry_ms`` old (default:
   ``timeout_ms``). A producer that answers within that time is asked once
   per transaction however often scans run: an unanswered check does not
   burn the check budget (RocketMQ checks a half message at most once per
   check interval; checking again at every scan would park the transactions
   of a slow but live producer).
2. For each, in order, each one in its own ``try`` (an error is logged and
   counted and the scan goes on: RocketMQ's scan stalls on one bad message,
   its issue 9500):
   a. re-read its state: a decision that arrived since the list was taken
      wins, and a decided transaction is never checked again (RocketMQ
      checks committed messages when its op queue lags: issues 1517, 8158);
   b. if it already got ``transaction.check_max`` checks (default 15), park
      it: copy it to ``TRANS_CHECK_MAX_TIME_TOPIC``, record ``parked``, log
      it; an operator lists, decides or resumes it;
   c. otherwise read the half record and add a :class:`CheckRequest` to the
      batch.
3. Every :data:`CHECK_BATCH` (256) requests, and at the end of the tick's
   share of the work, re-read each state once more (the last look before
   asking), then hand the batch to :meth:`CheckSender.send_checks` in one
   call: it sends each a RecoverOrphanedTransactionCommand on one live
   producer stream of its producer group (round robin, dead streams
   skipped) and says which were taken. Only a taken check counts (RocketMQ
   counts checks it never delivered: issue 1694) and starts its retry time;
   when no producer is live it is simply tried again next round. A batch
   whose hand-off raises counts one error per check. The sender paces checks
   to the producers: a stream holding
   ``transaction.max_outstanding_checks_per_producer`` unanswered checks
   (default 2,000) takes no more, and a transaction whose check is still
   outstanding at a live stream is not sent again; those are "not taken"
   too. Every EndTransaction (any source) tells the sender its check was
   answered (``service.on_end``); a check unanswered for ``check_retry_ms``
   at a stream that answered nothing meanwhile counts as lost. So that a
   scan does not read thousands of half records only to have them refused,
   a transaction the sender says is awaiting an answer
   (``awaiting_answer``) is skipped before its record is read, and once a
   whole batch of one (producer group, topic) was refused, the scan's other
   checks of that pair are counted unsent without being prepared.
4. Buffered check counts are appended to the op topic after each tick's
   share of the work, so a restart keeps them (a restart forgets the retry
   times: the first scan after it checks every due transaction).

When a scan had checks taken and others not (a producer is live but its
stream was full), the next scan starts ``check_retry_ms / 2`` after it began
(at most one interval, at least 100 ms) instead of a whole interval later, so
a producer gets new checks as it answers rather than idling until the next
interval.

A scan shares the broker's tick thread with the delay timer: each tick works
on it for at most ``transaction.check_tick_budget_ms`` (default 50 ms of real
time, at least one message) and the scan carries on at the next tick, which
the tick thread runs without sleeping while the scan is unfinished; a new
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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from halfmoon.broker.message import MessageView
from halfmoon.broker.transactions.config import TransactionConfig
from halfmoon.broker.transactions.service import TransactionService
from halfmoon.errors import NotFound

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """One check to hand to a producer: the half message as the producer should see it."""

    producer_group: str | None  # the half message's (None: any live producer of ``topic``)
    topic: str
    message: MessageView
    transaction_id: str


class CheckSender(Protocol):
    def send_checks(self, checks: Sequence[CheckRequest]) -> list[bool]:
        """Send each check to one live producer; per check, True only if a live stream took it.

        Called with up to :data:`CHECK_BATCH` checks at a time. Must not block
        for long; may raise (the whole batch then counts as errors, the scan
        goes on). A sender with only the older per-message method
        ``send_check(producer_group, topic, message, transaction_id) -> bool``
        is still accepted and called once per check.
        """


class _PerMessageSender(Protocol):
    """The older sender that :class:`CheckSender` still accepts: one call per check."""

    def send_check(
        self, producer_group: str | None, topic: str, message: MessageView, transaction_id: str
    ) -> bool: ...


# Checks prepared (state re-read, half record read) before they are handed to the sender at once.
CHECK_BATCH = 256


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
    def __init__(
        self, service: TransactionService, config: TransactionConfig, start_ms: int
    ) -> None:
        self._service = service
        self._config = config
        self._sender: CheckSender | None = None
        self._next_scan_ms = start_ms + config.check_interval_ms
        self._lock = threading.Lock()
        self._todo: collections.deque[int] = (
            collections.deque()
        )  # the current scan's remaining work
        self._report: ScanReport | None = None
        self._scan_now_ms = 0
        self._started = 0.0
        self._refused: set[tuple[str | None, str]] = (
            set()
        )  # (producer group, topic) with no room this scan
        self.last_report: ScanReport | None = None

    def set_sender(self, sender: CheckSender | None) -> None:
        """Use ``sender``; one that paces checks (``pace_checks``, ``answered``) gets the limits
        and answers."""
        self._sender = sender
        pace = getattr(sender, "pace_checks", None)
        if pace is not None:
            pace(
                max_outstanding=self._config.max_outstanding_checks_per_producer,
                lost_after_ms=self._config.retry_ms,
                clock=self._service.clock.now_ms,
            )
        self._service.on_end = getattr(sender, "answered", None)

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
        self._refused.clear()
        self._todo.extend(self._service.check_candidates(now_ms))
        self._report = ScanReport(candidates=len(self._todo))

    def _work(self, deadline: float | None) -> ScanReport | None:
        service, report, todo = self._service, self._report, self._todo
        assert report is not None
        batch: list[tuple[int, CheckRequest]] = []
        while todo:
            half_offset = todo.popleft()
            try:
                request = self._prepare(half_offset, self._scan_now_ms, report)
                if request is not None:
                    batch.append((half_offset, request))
            except Exception:
                self._failed(report, half_offset)
            if len(batch) >= CHECK_BATCH:
                self._dispatch(batch, report)
                batch = []
            if deadline is not None and time.monotonic() >= deadline:
                break  # the tick thread has other work: carry on at the next tick
        if batch:
            self._dispatch(batch, report)
        try:
            service.flush_ops()
        except Exception:
            log.exception("event=check_counts_not_saved")
        if todo:
            return None
        if report.sent and report.unsent:  # a live producer's stream was full: refill it soon
            refill_ms = max(min(self._config.retry_ms // 2, self._config.check_interval_ms), 100)
            self._next_scan_ms = min(self._next_scan_ms, self._scan_now_ms + refill_ms)
        report.elapsed_ms = int((time.monotonic() - self._started) * 1000)
        self._report = None
        self.last_report = report
        if report.candidates:
            log.info(
                "event=check_scan candidates=%d sent=%d unsent=%d parked=%d skipped=%d errors=%d "
                "elapsed_ms=%d",
                report.candidates,
                report.sent,
                report.unsent,
                report.parked,
                report.skipped,
                report.errors,
                report.elapsed_ms,
            )
        return report

    def _failed(self, report: ScanReport, half_offset: int) -> None:
        report.errors += 1
        self._service.counters.check_errors_total += 1
        log.exception("event=check_failed half_offset=%d", half_offset)

    def _prepare(self, half_offset: int, now_ms: int, report: ScanReport) -> CheckRequest | None:
        """Park the transaction or build its check; None when there is nothing to send."""
        service = self._service
        entry = service.checkable(half_offset, now_ms)
        if entry is None:
            report.skipped += 1
            return None
        if entry.checks >= self._config.check_max:
            if service.park(half_offset):
                report.parked += 1
            else:
                report.skipped += 1
            return None
        awaiting = getattr(self._sender, "awaiting_answer", None)
        if (entry.producer_group, entry.topic) in self._refused or (
            awaiting is not None and awaiting(entry.transaction_id)
        ):
            report.unsent += 1  # the producer has not answered its last check / has no room yet
            service.counters.checks_unsent_total += 1
            return None
        try:
            view = service.check_view(entry)
        except NotFound:  # retention removed the half record: nothing left to ask about or publish
            service.forget_lost(half_offset)
            report.errors += 1
            return None
        return CheckRequest(entry.producer_group, entry.topic, view, entry.transaction_id)

    def _dispatch(self, batch: list[tuple[int, CheckRequest]], report: ScanReport) -> None:
        """Hand a batch to the sender; count the checks a live stream took."""
        service, sender = self._service, self._sender
        now_ms = self._scan_now_ms
        # The last look before asking: a decision may have landed while the batch was read.
        wanted = []
        for half_offset, request in batch:
            if service.checkable(half_offset, now_ms) is None:
                report.skipped += 1
            else:
                wanted.append((half_offset, request))
        if not wanted:
            return
        taken: list[bool | None]
        if sender is None:
            taken = [False] * len(wanted)
        elif hasattr(sender, "send_checks"):
            try:
                taken = list(sender.send_checks([request for _, request in wanted]))
            except Exception:
                for half_offset, _ in wanted:
                    self._failed(report, half_offset)
                return
            if len(taken) != len(wanted):
                raise RuntimeError(
                    f"CheckSender answered {len(taken)} results for {len(wanted)} checks"
                )
        else:
            # Not a CheckSender after all: the older per-message kind (see CheckSender).
            taken = self._send_one_by_one(cast(_PerMessageSender, sender), wanted, report)
        took_by_pair: dict[tuple[str | None, str], bool] = {}
        for (_, request), took in zip(wanted, taken, strict=True):
            if took is not None:  # None: failed, says nothing about room
                pair = (request.producer_group, request.topic)
                took_by_pair[pair] = took_by_pair.get(pair, False) or took
        self._refused.update(pair for pair, took in took_by_pair.items() if not took)
        for (half_offset, _), took in zip(wanted, taken, strict=True):
            if took is None:
                continue  # failed: already counted as an error
            if not took:
                report.unsent += 1
                service.counters.checks_unsent_total += 1
            elif service.record_check(half_offset, now_ms) is None:
                report.skipped += 1  # decided while the check was on its way: nothing to count
            else:
                report.sent += 1

    def _send_one_by_one(
        self, sender: _PerMessageSender, wanted: list[tuple[int, CheckRequest]], report: ScanReport
    ) -> list[bool | None]:
        """The older per-message sender: each check asked for on its own, rechecked just before."""
        taken: list[bool | None] = []
        for half_offset, r in wanted:
            try:
                if self._service.checkable(half_offset, self._scan_now_ms) is None:
                    report.skipped += 1
                    taken.append(None)
                    continue
                taken.append(
                    bool(sender.send_check(r.producer_group, r.topic, r.message, r.transaction_id))
                )
            except Exception:
                self._failed(report, half_offset)
                taken.append(None)
        return taken
