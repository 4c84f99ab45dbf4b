"""The check service's side of the transaction ledger: what is due, checks counted, parking.

:class:`halfmoon.broker.transactions.check.CheckService` drives a scan with
these calls, each taking the ledger's lock for one step:

1. :meth:`CheckLedger.due_lanes` — the (producer group, topic) lanes with a
   transaction due now (:mod:`due_index`);
2. :meth:`CheckLedger.next_due` — take a lane's next due transaction out of
   the index (its check is then prepared, sent, counted or put back);
3. :meth:`CheckLedger.record_check` — a live producer took the check: count
   it and index the transaction again ``check_retry_ms`` later (and no
   sooner than the next regular scan);
   :meth:`CheckLedger.requeue` — it could not be sent: index it again as it
   was; :meth:`CheckLedger.park` — it ran out of checks;
4. :meth:`CheckLedger.done_with` — the scan leaves the lane (back on the
   index's schedule at its earliest entry).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from halfmoon.broker.message import MessageView
from halfmoon.broker.transaction_state import TxnEvent, TxnState, next_state
from halfmoon.broker.transactions.due_index import Lane
from halfmoon.broker.transactions.ledger import TransactionLedger
from halfmoon.broker.transactions.oplog import Op, OpKind, op_message
from halfmoon.broker.transactions.records import PendingTxn, check_view, parked_from_half
from halfmoon.store.message import StoredMessage

log = logging.getLogger(__name__)


class CheckLedger:
    """The check service's steps over the ledger it is given (one lock hold each)."""

    def __init__(self, ledger: TransactionLedger) -> None:
        self.ledger = ledger

    def due_lanes(self, now_ms: int) -> list[Lane]:
        """Lanes with a transaction due for a check at ``now_ms``; each is the scan's until
        :meth:`done_with`."""
        with self.ledger.lock:
            return self.ledger.due.due_lanes(now_ms)

    def next_due(self, lane: Lane, now_ms: int) -> PendingTxn | None:
        """Take the next transaction of ``lane`` due at ``now_ms`` out of the index (None: the
        lane has no more). The caller counts, requeues or parks it."""
        with self.ledger.lock:
            return self.ledger.due.pop_due(lane, now_ms)

    def has_due(self, lane: Lane, now_ms: int) -> bool:
        with self.ledger.lock:
            return self.ledger.due.has_due(lane, now_ms)

    def requeue(self, entries: Iterable[PendingTxn], not_before_ms: int = 0) -> None:
        """Index again transactions taken but not checked (no room, awaiting an answer, an
        error), as due as they were or at ``not_before_ms`` if later; those decided or parked
        meanwhile stay out."""
        with self.ledger.lock:
            for entry in entries:
                if (
                    self.ledger.pending.get(entry.half_offset) is entry
                    and entry.state is TxnState.PREPARED
                    and entry.group is None
                    and entry not in self.ledger.due
                ):
                    self.ledger.due.add(entry, max(self.ledger.check_due_ms(entry), not_before_ms))

    def done_with(self, lane: Lane) -> None:
        with self.ledger.lock:
            self.ledger.due.reschedule(lane)

    def checkable(self, half_offset: int, now_ms: int) -> PendingTxn | None:
        """The entry if it still wants a check now (decisions may have arrived meanwhile)."""
        with self.ledger.lock:
            entry = self.ledger.pending.get(half_offset)
            if entry is None or entry.state is not TxnState.PREPARED or entry.due_ms > now_ms:
                return None
            if (
                entry.last_check_ms is not None
                and entry.last_check_ms + self.ledger.config.retry_ms > now_ms
            ):
                return None  # its last check may still be answered: do not spend another
            return entry

    def check_view(self, entry: PendingTxn) -> MessageView:
        """What the producer is shown; the half record read for it is kept (cache permitting)
        for the commit that most likely answers the check, so that needs no second read."""
        half = entry.record
        if not isinstance(half, StoredMessage):
            half = self.ledger.read_half(entry.half_offset, entry.half_end)
            with self.ledger.lock:
                if self.ledger.pending.get(entry.half_offset) is entry:
                    self.ledger.keep_record(entry, half)
        return check_view(half, entry)

    def record_check(self, sent: PendingTxn, now_ms: int, sent_ms: int | None = None) -> int | None:
        """Count a check that reached a producer; the new count (None if decided meanwhile).

        The next check waits ``config.retry_ms`` from when this one was taken
        (the later of ``now_ms`` and the clock: a long scan hands checks over
        after its start time): the transaction is indexed again for then.
        ``sent_ms`` is when the check went out: the trace records it then, and
        records it too when the producer's answer decided the transaction before
        this count (a fast producer answers while the sender is still returning).
        """
        with self.ledger.lock:
            entry = self.ledger.pending.get(sent.half_offset)
            if entry is None:  # answered and decided before this count
                self.ledger.traced(sent, "check_sent", check=sent.checks + 1, at_ms=sent_ms)
                return None
            if entry.state is not TxnState.PREPARED:
                return None
            entry.state = next_state(entry.state, TxnEvent.CHECK_SENT)
            entry.checks += 1
            entry.last_check_ms = max(now_ms, self.ledger.clock.now_ms())
            # Not before the retry time, nor before the next regular scan: refill scans (every
            # 200 ms while a producer is full) must not check a transaction more often than
            # once per interval, or a silent producer's transactions would park sooner.
            self.ledger.due.add(
                entry,
                max(self.ledger.check_due_ms(entry), now_ms + self.ledger.config.check_interval_ms),
            )
            self.ledger.op_buffer.append(Op(OpKind.CHECKED, entry.half_offset, checks=entry.checks))
            self.ledger.counters.checks_sent_total += 1
            self.ledger.traced(entry, "check_sent", check=entry.checks, at_ms=sent_ms)
            self.ledger.dirty = True
            return entry.checks

    def forget_lost(self, half_offset: int) -> None:
        """Drop a pending transaction whose half record retention removed (it can never commit)."""
        with self.ledger.lock:
            entry = self.ledger.pending.get(half_offset)
            if entry is None:
                return
            self.ledger.remove_pending(entry)
            self.ledger.counters.lost_total += 1
            self.ledger.dirty = True
            log.error(
                "event=half_message_lost transaction_id=%s topic=%s message_id=%s: removed by "
                "retention before any decision; raise the store's retention or decide "
                "transactions sooner",
                entry.transaction_id,
                entry.topic,
                entry.message_id,
            )

    def flush_ops(self) -> None:
        """Append buffered check counts now (the check service calls it after each scan)."""
        with self.ledger.lock:
            if self.ledger.op_buffer:
                self.ledger.write([])

    def park(self, half_offset: int) -> bool:
        """Move a transaction that ran out of checks to the check-max topic; False if decided."""
        with self.ledger.lock:
            entry = self.ledger.pending.get(half_offset)
            if entry is None or entry.state is not TxnState.PREPARED:
                return False
            new = next_state(entry.state, TxnEvent.PARK, transaction_id=entry.transaction_id)
            half = self.ledger.read_half(entry.half_offset, entry.half_end)
            self.ledger.write(
                [
                    op_message(Op(OpKind.PARKED, half_offset, checks=entry.checks)),
                    parked_from_half(half),
                ]
            )
            entry.state = new
            self.ledger.due.discard(entry)
            self.ledger.drop_record(entry)
            self.ledger.counters.parked_total += 1
            self.ledger.traced(entry, "parked", checks=entry.checks)
            log.warning(
                "event=transaction_parked transaction_id=%s topic=%s message_id=%s checks=%d "
                "producer_group=%s: no answer after the check limit; resume or decide it by hand",
                entry.transaction_id,
                entry.topic,
                entry.message_id,
                entry.checks,
                entry.producer_group,
            )
            return True
