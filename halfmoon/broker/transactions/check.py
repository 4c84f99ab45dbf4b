"""The check service: ask a live producer about every transaction left open.

Algorithm (driven by :meth:`CheckService.tick`, which the broker's tick thread
calls with its clock's time, every ``server.tick_interval`` (100 ms) and at
once again while a scan is unfinished; only the per-tick work budget is real
time):

1. Once every ``transaction.check_interval_ms`` (default 30 s; the first scan
   one interval after the broker opens), take the *due* transactions from the
   due index (:mod:`due_index`): PREPARED half messages outside transaction
   groups (their group decides), first due ``transaction.timeout_ms`` after
   they were stored (default 6 s; their check immunity instead when the
   producer gave one: ``orphaned_transaction_recovery_duration``, capped at
   ``transaction.max_immunity_ms``, default 1 h), and again
   ``transaction.check_retry_ms`` (default: ``timeout_ms``) after their last
   counted check. A producer that answers within that time is asked once
   per transaction however often scans run: an unanswered check does not
   burn the check budget (RocketMQ checks a half message at most once per
   check interval; checking again at every scan would park the transactions
   of a slow but live producer). The index is kept per *lane*, a (producer
   group, topic) pair, by due time: a scan costs what is due and what it
   sends, never what is merely pending (a commit or rollback only
   invalidates its index entry).
2. Lane by lane, take the due transactions one at a time, each in its own
   ``try`` (an error is logged and counted and the scan goes on: RocketMQ's
   scan stalls on one bad message, its issue 9500):
   a. a decision that arrived since it was indexed wins (its entry is
      gone), and a decided transaction is never checked again (RocketMQ
      checks committed messages when its op queue lags: issues 1517, 8158);
   b. if it already got ``transaction.check_max`` checks (default 15), park
      it: copy it to ``TRANS_CHECK_MAX_TIME_TOPIC``, record ``parked``, log
      it; an operator lists, decides or resumes it;
   c. otherwise read the half record and add a :class:`CheckRequest` to the
      lane's batch.
3. Every :data:`CHECK_BATCH` (256) requests, and at the end of the tick's
   share of the work, re-read each state once more (the last look before
   asking), then hand the batch to :meth:`CheckSender.send_checks` in one
   call: it sends each a RecoverOrphanedTransactionCommand on one live
   producer stream of its producer group (round robin, dead streams
   skipped) and says which were taken. Only a taken check counts (RocketMQ
   counts checks it never delivered: issue 1694), starts its retry time and
   puts the transaction back in the index for then; a check not taken puts
   it back as due, once the scan is done with its lane (tried again next
   round, uncounted). A batch whose hand-off raises counts one error per
   check. The sender paces checks to the producers: a stream holding
   ``transaction.max_outstanding_checks_per_producer`` unanswered checks
   (default 2,000) takes no more, and a transaction whose check is still
   outstanding at a live stream is not sent again; those are "not taken"
   too. Every EndTransaction (any source) tells the sender its check was
   answered (``service.on_end``); a check unanswered for ``check_retry_ms``
   at a stream that answered nothing meanwhile counts as lost. So that a
   scan does not read thousands of half records only to have them refused,
   a transaction the sender says is awaiting an answer
   (``awaiting_answer``) is set aside before its record is read, and once a
   whole batch of a lane was refused the scan leaves the lane: the rest of
   its due transactions are not even taken out of the index. A lane refused
   in one scan is probed with a batch of :data:`PROBE_BATCH` in the next.
4. Buffered check counts are appended to the op topic after each tick's
   share of the work, so a restart keeps them (a restart forgets the retry
   times: the first scan after it checks every due transaction).

When a scan had checks taken and others not (a producer is live but its
stream was full), the next scan starts ``check_retry_ms / 2`` after it began
(at most one interval, at most :data:`REFILL_MAX_MS`, at least 100 ms)
instead of a whole interval later, so a producer gets new checks as it
answers rather than idling until the next interval; such a refill costs
what it sends plus one probe per full lane.

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
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions.config import TransactionConfig
from halfmoon.broker.transactions.due_index import Lane
from halfmoon.broker.transactions.records import PendingTxn
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
# The first batch of a lane the previous scan found full: a full producer costs this many reads.
PROBE_BATCH = 16
# A refill scan (a producer's stream was full) follows its scan by at most this much.
REFILL_MAX_MS = 200


@dataclass
class ScanReport:
    candidates: int = 0  # due transactions taken from the index
    sent: int = 0
    unsent: int = 0  # no live producer, no room, or awaiting an answer: retried, not counted
    full_lanes: int = 0  # lanes left with due transactions because no live stream had room
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
        self._lanes: collections.deque[Lane] = collections.deque()  # the current scan's lanes
        self._aside: list[PendingTxn] = []  # taken from the current lane, not checked
        self._later: list[PendingTxn] = []  # likewise, awaiting an answer to their last check
        self._report: ScanReport | None = None
        self._scan_now_ms = 0
        self._started = 0.0
        self._full: set[Lane] = set()  # lanes refused in the last scan: probed first
        self._refused: set[Lane] = set()  # lanes refused in this scan
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
        self._service.ledger.on_end = getattr(sender, "answered", None)

    @property
    def next_scan_ms(self) -> int:
        """When the next scan starts (now, while one is under way)."""
        return self._scan_now_ms if self._report is not None else self._next_scan_ms

    def next_check_ms(self, entry: PendingTxn) -> int | None:
        """When a scan will next take ``entry``: the first scan at or after it is due (stored
        ``timeout_ms`` or its immunity ago) and its last check's retry time is over. At the
        check limit that scan parks it instead. None when no check is coming: parked, or a
        transaction group's member (its group decides). A producer that is not connected then
        is asked at the scan after."""
        if entry.state is not TxnState.PREPARED or entry.group is not None:
            return None
        ready = entry.due_ms
        if entry.last_check_ms is not None:
            ready = max(ready, entry.last_check_ms + self._config.retry_ms)
        scan = self._next_scan_ms
        if self._report is not None and ready <= self._scan_now_ms:
            return self._scan_now_ms  # the scan under way takes it
        if ready > scan:
            interval = max(self._config.check_interval_ms, 1)
            scan += -(-(ready - scan) // interval) * interval
        return scan

    @property
    def scanning(self) -> bool:
        """True while a scan is spread over several ticks."""
        return self._report is not None

    def tick(self, now_ms: int) -> ScanReport | None:
        """Start a scan when an interval has passed; work on it for at most the tick budget.

        Returns the report of a scan that finished during this tick, else None.
        """
        self._service.ledger.drop_old_records(now_ms)
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
        self._full, self._refused = self._refused, set()
        self._lanes.extend(self._service.checks.due_lanes(now_ms))
        self._report = ScanReport()

    def _work(self, deadline: float | None) -> ScanReport | None:
        """Work through the scan's lanes until done or past ``deadline`` (None: no limit)."""
        report = self._report
        assert report is not None
        while self._lanes:
            lane = self._lanes[0]
            if self._work_on_lane(lane, report, deadline):
                self._lanes.popleft()
                self._leave(lane)
            if deadline is not None and time.monotonic() >= deadline:
                break  # the tick thread has other work: carry on at the next tick
        try:
            self._service.checks.flush_ops()
        except Exception:
            log.exception("event=check_counts_not_saved")
        if self._lanes:
            return None
        return self._finish(report)

    def _work_on_lane(self, lane: Lane, report: ScanReport, deadline: float | None) -> bool:
        """Check the lane's due transactions a batch at a time; True once the lane is done
        (empty, or full), False when the deadline came first."""
        service, now_ms = self._service, self._scan_now_ms
        room = self._room(lane)
        if room is None:  # the sender cannot tell: find out by asking, a probe after a refusal
            size = PROBE_BATCH if lane in self._full else CHECK_BATCH
        else:
            size = min(room, CHECK_BATCH)
        while True:
            if size <= 0:  # the lane's live streams are full (or none is live): leave it alone
                if service.checks.has_due(lane, now_ms):
                    self._left_full(lane, report)
                return True
            batch: list[tuple[PendingTxn, CheckRequest]] = []
            more = True
            while len(batch) < size:
                entry = service.checks.next_due(lane, now_ms)
                if entry is None:
                    more = False
                    break
                report.candidates += 1
                try:
                    request = self._prepare(entry, report)
                    if request is not None:
                        batch.append((entry, request))
                except Exception:
                    self._aside.append(entry)
                    self._failed(report, entry.half_offset)
                if deadline is not None and time.monotonic() >= deadline:
                    break
            taken, refused = self._dispatch(batch, report) if batch else (0, 0)
            if refused and not taken:
                self._left_full(lane, report)
                return True  # no live stream of the lane has room: leave the rest in the index
            if not more or not service.checks.has_due(lane, now_ms):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            size = CHECK_BATCH if room is None else min(room - taken, CHECK_BATCH)
            if room is not None:
                room -= taken

    def _room(self, lane: Lane) -> int | None:
        """How many checks the lane's live producer streams take now; None when the sender
        cannot tell (then a refused batch tells)."""
        room = getattr(self._sender, "room", None)
        if self._sender is None:
            return 0
        if room is None:
            return None
        try:
            return max(0, int(room(*lane)))
        except Exception:
            log.exception("event=check_room_failed producer_group=%s topic=%s", *lane)
            return None

    def _left_full(self, lane: Lane, report: ScanReport) -> None:
        self._refused.add(lane)
        report.full_lanes += 1

    def _leave(self, lane: Lane) -> None:
        """The scan is done with ``lane``: what it set aside goes back (those awaiting an answer
        one retry time later), the lane on the schedule."""
        aside, self._aside = self._aside, []
        later, self._later = self._later, []
        self._service.checks.requeue(aside)
        self._service.checks.requeue(later, self._scan_now_ms + self._config.retry_ms)
        self._service.checks.done_with(lane)

    def _finish(self, report: ScanReport) -> ScanReport:
        if report.full_lanes and (report.sent or hasattr(self._sender, "room")):
            # A live producer's stream was full: refill it soon rather than an interval later
            # (a sender that tells its room makes a refill cost nothing when none is live).
            config = self._config
            refill_ms = max(min(config.retry_ms // 2, config.check_interval_ms, REFILL_MAX_MS), 100)
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

    def _prepare(self, entry: PendingTxn, report: ScanReport) -> CheckRequest | None:
        """Park the transaction or build its check; None when there is nothing to send."""
        service = self._service
        if entry.checks >= self._config.check_max:
            if service.checks.park(entry.half_offset):
                report.parked += 1
            else:
                report.skipped += 1
            return None
        awaiting = getattr(self._sender, "awaiting_answer", None)
        if awaiting is not None and awaiting(entry.transaction_id):
            # The producer has not answered its last check yet: look again a retry time later.
            report.unsent += 1
            service.counters.checks_unsent_total += 1
            self._later.append(entry)
            return None
        try:
            view = service.checks.check_view(entry)
        except NotFound:  # retention removed the half record: nothing left to ask about or publish
            service.checks.forget_lost(entry.half_offset)
            report.errors += 1
            return None
        return CheckRequest(entry.producer_group, entry.topic, view, entry.transaction_id)

    def _unsent(self, report: ScanReport, entry: PendingTxn) -> None:
        report.unsent += 1
        self._service.counters.checks_unsent_total += 1
        self._aside.append(entry)

    def _dispatch(
        self, batch: list[tuple[PendingTxn, CheckRequest]], report: ScanReport
    ) -> tuple[int, int]:
        """Hand a lane's batch to the sender; count the checks a live stream took. Returns how
        many were taken and how many refused (all refused: no live stream of the lane has
        room)."""
        service, sender = self._service, self._sender
        now_ms = self._scan_now_ms
        # The last look before asking: a decision may have landed while the batch was read.
        wanted = []
        for entry, request in batch:
            if service.checks.checkable(entry.half_offset, now_ms) is None:
                report.skipped += 1
            else:
                wanted.append((entry, request))
        if not wanted:
            return 0, 0
        taken: list[bool | None]
        sent_ms = service.clock.now_ms()  # when these checks went out, for the trace
        if sender is None:
            taken = [False] * len(wanted)
        elif hasattr(sender, "send_checks"):
            try:
                taken = list(sender.send_checks([request for _, request in wanted]))
            except Exception:
                for entry, _ in wanted:
                    self._aside.append(entry)
                    self._failed(report, entry.half_offset)
                return 0, 0
            if len(taken) != len(wanted):
                log.error("event=check_sender_broken checks=%d answers=%d", len(wanted), len(taken))
                taken = [None] * len(wanted)
                for entry, _ in wanted:
                    self._aside.append(entry)
                    report.errors += 1
                    service.counters.check_errors_total += 1
        else:
            # Not a CheckSender after all: the older per-message kind (see CheckSender).
            taken = self._send_one_by_one(cast(_PerMessageSender, sender), wanted, report)
        took_count = refused = 0
        for (entry, _), took in zip(wanted, taken, strict=True):
            if took is None:
                continue  # failed (already counted as an error and set aside) or skipped
            if not took:
                refused += 1
                self._unsent(report, entry)
                continue
            took_count += 1
            if service.checks.record_check(entry, now_ms, sent_ms) is None:
                report.skipped += 1  # decided while the check was on its way: nothing to count
            else:
                report.sent += 1
        return took_count, refused

    def _send_one_by_one(
        self,
        sender: _PerMessageSender,
        wanted: list[tuple[PendingTxn, CheckRequest]],
        report: ScanReport,
    ) -> list[bool | None]:
        """The older per-message sender: each check asked for on its own, rechecked just before."""
        taken: list[bool | None] = []
        for entry, r in wanted:
            try:
                if self._service.checks.checkable(entry.half_offset, self._scan_now_ms) is None:
                    report.skipped += 1
                    taken.append(None)
                    continue
                taken.append(
                    bool(sender.send_check(r.producer_group, r.topic, r.message, r.transaction_id))
                )
            except Exception:
                self._aside.append(entry)
                self._failed(report, entry.half_offset)
                taken.append(None)
        return taken
