"""``TransactionService``: half messages, decisions, transaction groups, and their durability.

Memory holds only the undecided: one :class:`PendingTxn` per half message
that is PREPARED or PARKED, plus a bounded cache of recent decisions. Every
change of state goes through the transition table
(:mod:`halfmoon.broker.transaction_state`) and is appended to the store
before it is made in memory, all under one lock, so the store's order is the
order of events. What is appended (see :mod:`oplog`):

- commit: the real message itself, one record carrying the half record's
  offset in ``prepared_transaction_offset``. It is the commit record: there is
  no separate op, so nothing can be torn between a decision and its message;
- rollback, checks, parking, resuming: an op record in the op topic;
- a group decision: one op record (the group's commit point), then the
  members' real messages in batches.

Durability: a decision's records are *written* when :meth:`end` returns; its
:class:`EndResult` carries the end offset to wait for (``store.durable``)
before acknowledging the producer. Group decisions are awaited by the broker
facade.

Restart (:mod:`recovery`): the pending set is snapshotted to
``<metadata_dir>/transactions.json`` with the half and op queue offsets it
covers (only after the store is durable up to what it claims). Opening loads
the snapshot, replays the half and op queues from those offsets, and asks the
key index whether each pending transaction's real message exists (committed
after the snapshot), so the work is bounded by the undecided transactions
and what happened since the last snapshot, not by history. A group commit cut
short by a crash is finished.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from halfmoon.broker.clock import Clock
from halfmoon.broker.message import (
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_GROUP,
    MessageType,
    MessageView,
    OutgoingMessage,
)
from halfmoon.broker.produce import PlannedMessage
from halfmoon.broker.transaction_state import TxnEvent, TxnState, next_state
from halfmoon.broker.transactions.config import TransactionConfig
from halfmoon.broker.transactions.errors import (
    InvalidTransactionId,
    TransactionGroupEnded,
    TransactionGroupMember,
)
from halfmoon.broker.transactions.groups import check_group_id
from halfmoon.broker.transactions.ids import decode_transaction_id
from halfmoon.broker.transactions.ledger import (
    LATENCY_BUCKETS_MS,
    TransactionInfo,
    TransactionLedger,
    TransactionStats,
)
from halfmoon.broker.transactions.oplog import HALF_TOPIC, Op, OpKind, op_message
from halfmoon.broker.transactions.records import (
    PendingTxn,
    check_view,
    immunity_ms_of,
    make_half,
    parked_from_half,
    pending_from_half,
    real_from_half,
)
from halfmoon.broker.transactions.recovery import (
    Recovered,
    real_exists,
    recover,
    stored_group_decision,
)
from halfmoon.errors import InvalidArgument, NotFound
from halfmoon.store.api import AppendResult, Store
from halfmoon.store.message import PROPERTY_UNIQUE_ID, Message

log = logging.getLogger(__name__)

RESOLUTIONS = {
    "commit": TxnEvent.COMMIT,
    "rollback": TxnEvent.ROLLBACK,
    "unknown": TxnEvent.UNKNOWN,
}
SOURCES = ("client", "check", "operator")
# Half records are kept in memory (for a commit without a read) up to this many body bytes in all.
RECORD_CACHE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class EndResult:
    state: TxnState  # the transaction's state after the call
    end_offset: int  # await store.durable(end_offset) before acknowledging (0: nothing to wait for)
    changed: bool  # False for a repeated decision or UNKNOWN


def _event(resolution: str) -> TxnEvent:
    try:
        return RESOLUTIONS[resolution.lower()]
    except (KeyError, AttributeError):
        raise InvalidArgument(
            f"unknown transaction resolution {resolution!r}: use commit, rollback or unknown"
        ) from None


def _check_source(source: str) -> str:
    if source not in SOURCES:
        raise InvalidArgument(f"unknown transaction source {source!r}: use {', '.join(SOURCES)}")
    return source


class TransactionService(TransactionLedger):
    def __init__(
        self,
        store: Store,
        metadata_dir: Path | None,
        config: TransactionConfig,
        clock: Clock,
    ) -> None:
        path = metadata_dir / self.SNAPSHOT_FILE if metadata_dir is not None else None
        recovered = recover(store, path, config)
        super().__init__(store, path, config, clock, recovered)
        self._finish_recovery(recovered)

    def _finish_recovery(self, recovered: Recovered) -> None:
        """Complete the group commits a crash cut short; snapshot when anything was replayed."""
        finished = 0
        with self._lock:
            for group in list(self.groups.unfinished):
                finished += self.finish_group(group)[0]
            self.counters.redone_commits_total += finished
        if recovered.replayed:
            self._dirty = True
            self.snapshot()
        log.info(
            "event=transactions_recovered pending=%d committed_since_snapshot=%d "
            "group_members_finished=%d",
            len(self.pending),
            recovered.committed,
            finished,
        )

    # -- the send path ---------------------------------------------------------------
    def append(
        self, messages: Sequence[OutgoingMessage], planned: Sequence[PlannedMessage]
    ) -> tuple[list[AppendResult], list[str | None]]:
        """Store a batch with TRANSACTION messages as half records; the rest as planned.

        Returns the append results and, per message, its transaction id (None
        for the non-transactional ones). All or nothing, like ``store.append``.
        """
        cap_s = self.config.max_immunity_ms // 1000
        records: list[Message] = []
        halves: list[int] = []
        for index, (msg, plan) in enumerate(zip(messages, planned, strict=True)):
            if msg.message_type is not MessageType.TRANSACTION:
                records.append(plan.record)
                continue
            if msg.transaction_group is not None:
                check_group_id(msg.transaction_group)
            immunity = msg.check_immunity_seconds
            if immunity is not None:
                immunity = min(max(immunity, 0), cap_s)
            records.append(make_half(plan.record, plan.topic, plan.queue_id, immunity))
            halves.append(index)
        ids: list[str | None] = [None] * len(records)
        with self._lock:
            for group in {messages[i].transaction_group for i in halves} - {None}:
                decided = self._group_state(group)  # type: ignore[arg-type]
                if decided is not None:
                    raise TransactionGroupEnded(
                        f"transaction group {group!r} is already "
                        f"{decided.value.replace('_', ' ')}; "
                        "a late member would break its all-or-nothing: send it with a new group id"
                    )
            results = self._append(records)
            now = self.clock.now_ms()
            for index in halves:
                result = results[index]
                entry = PendingTxn(
                    half_offset=result.commit_log_offset,
                    half_end=result.end_offset,
                    topic=planned[index].topic,
                    queue_id=planned[index].queue_id,
                    message_id=planned[index].message_id,
                    keys=tuple(messages[index].keys),
                    producer_group=messages[index].producer_group,
                    group=messages[index].transaction_group,
                    stored_ms=now,
                    due_ms=now + self._first_check_delay(records[index]),
                )
                if self._cached_bytes < RECORD_CACHE_BYTES:
                    entry.record = records[index]
                    self._cached_bytes += len(entry.record.body)
                self._add_pending(entry)
                self.half_next = max(self.half_next, result.queue_offset + 1)
                ids[index] = entry.transaction_id
        return results, ids

    def _first_check_delay(self, half: Message) -> int:
        immunity = immunity_ms_of(half.properties)
        return immunity if immunity > 0 else self.config.timeout_ms

    # -- decisions -------------------------------------------------------------------
    def end(
        self,
        transaction_id: str,
        resolution: str,
        source: str = "client",
        *,
        message_id: str = "",
        topic: str = "",
    ) -> EndResult:
        """Apply a producer's, a check answer's or an operator's decision (see the module docs)."""
        event = _event(resolution)
        _check_source(source)
        half_offset = decode_transaction_id(transaction_id)
        if self.on_end is not None:
            self.on_end(transaction_id)
        with self._lock:
            entry = self.pending.get(half_offset)
            if entry is not None and entry.group in self.groups.unfinished:
                self.finish_group(entry.group)  # its group is decided
                entry = None
            if entry is None:
                state, end_offset = self._decision_of(half_offset, transaction_id)
                return EndResult(
                    next_state(state, event, transaction_id=transaction_id), end_offset, False
                )
            if (message_id and message_id != entry.message_id) or (topic and topic != entry.topic):
                raise InvalidTransactionId(
                    f"transaction {transaction_id!r} belongs to message {entry.message_id!r} "
                    f"of topic {entry.topic!r}, not to {message_id or '?'!r} of {topic or '?'!r}"
                )
            if entry.group is not None and event is not TxnEvent.UNKNOWN:
                raise TransactionGroupMember(
                    f"transaction {transaction_id!r} is a member of transaction group "
                    f"{entry.group!r}: "
                    "it is committed or rolled back with its group (end the group instead)"
                )
            new = next_state(entry.state, event, transaction_id=transaction_id)
            if new is entry.state:
                return EndResult(new, 0, False)
            end_offset = self._decide(entry, new, source)
            return EndResult(new, end_offset, True)

    def ends_cheaply(self, transaction_id: str) -> bool:
        """True when :meth:`end` for this id needs no index lookup: pending (not a group member)
        or recently decided. The server then runs it on its event loop (the rest needs a worker
        thread).
        """
        try:
            half_offset = decode_transaction_id(transaction_id)
        except InvalidTransactionId:
            return False  # the worker path raises the error
        entry = self.pending.get(half_offset)
        if entry is not None:
            return entry.group is None
        return half_offset in self._decided

    def _decide(self, entry: PendingTxn, state: TxnState, source: str) -> int:
        """Append the decision of one transaction (and its real message); forget it. Locked."""
        if state is TxnState.COMMITTED:  # the real message is the commit record: one append
            batch = [real_from_half(self._half_of(entry), entry.half_offset)]
        else:
            batch = [op_message(Op(OpKind.ROLLBACK, entry.half_offset, source=source))]
        results = self._append(batch)
        end_offset = results[-1].end_offset
        self._settle(entry, state, end_offset)
        return end_offset

    def _settle(self, entry: PendingTxn, state: TxnState, end_offset: int) -> None:
        self._remove_pending(entry)
        self.remember(entry.half_offset, state, end_offset)
        if state is TxnState.COMMITTED:
            self.counters.committed_total += 1
        else:
            self.counters.rolled_back_total += 1
        self._latency[
            bisect.bisect_left(LATENCY_BUCKETS_MS, self.clock.now_ms() - entry.stored_ms)
        ] += 1

    def remember(self, half_offset: int, state: TxnState, end_offset: int) -> None:
        self._decided[half_offset] = (state, end_offset)
        self._decided.move_to_end(half_offset)
        while len(self._decided) > self.config.decided_cache_entries:
            self._decided.popitem(last=False)

    def _decision_of(self, half_offset: int, transaction_id: str) -> tuple[TxnState, int]:
        """The decision on a transaction that is not pending: cache, op key index, its group."""
        hit = self._decided.get(half_offset)
        if hit is not None:
            return hit
        try:
            half = self.store.read_at(half_offset)
        except NotFound:
            half = None
        if half is None or half.topic != HALF_TOPIC:
            raise InvalidTransactionId(
                f"no transaction {transaction_id!r} is known to this broker; "
                "use the transaction id from the send result of the half message"
            )
        group = half.properties.get(PROPERTY_TRANSACTION_GROUP)
        decided = self._group_decision(group) if group else None
        if decided is not None:
            return decided
        # Not pending, so decided. The half record is still stored, hence so is a commit's
        # real message (appended after it; retention removes the oldest first).
        topic, message_id = half.properties.get(PROPERTY_REAL_TOPIC, ""), half.unique_id or ""
        committed = real_exists(self.store, topic, message_id, half_offset)
        state = TxnState.COMMITTED if committed else TxnState.ROLLED_BACK
        self.remember(half_offset, state, 0)
        return state, 0

    # -- transaction groups ----------------------------------------------------------
    def end_group(
        self, group: str, resolution: str, source: str = "client", *, body: bytes = b""
    ) -> tuple[int, int]:
        """Decide every member of ``group`` at once; returns (members decided now, end offset).

        The group's op record is the commit point (``body``: the group's consume
        actions, :mod:`consume`); the members' real messages follow in batches of
        ``group_batch_size``. Repeating the decision is a no-op (0 members), the
        opposite one is TransactionAlreadyEnded.
        """
        check_group_id(group)
        event = _event(resolution)
        _check_source(source)
        if event is TxnEvent.UNKNOWN:
            return 0, 0
        label = f"hm-group:{group}"
        with self._lock:
            decided = self._group_decision(group)
            if decided is not None:
                state, end_offset = decided
                next_state(state, event, transaction_id=label)
                if group in self.groups.unfinished:
                    count, end_offset = self.finish_group(group)
                    return count, end_offset
                return 0, end_offset
            state = next_state(TxnState.PREPARED, event, transaction_id=label)
            kind = OpKind.GROUP_COMMIT if state is TxnState.COMMITTED else OpKind.GROUP_ROLLBACK
            (result,) = self._append([op_message(Op(kind, group=group, source=source), body)])
            self.groups.remember(group, state, result.end_offset)
            self.groups.unfinished[group] = state
            count, end_offset = self.finish_group(group)
            return count, max(end_offset, result.end_offset)

    def finish_group(self, group: str) -> tuple[int, int]:
        """Complete the members of a decided group still pending. Locked."""
        state = self.groups.unfinished[group]
        members = sorted(self.groups.members.get(group, ()))
        size = self.config.group_batch_size
        end_offset = 0
        for start in range(0, len(members), size):
            entries = [self.pending[h] for h in members[start : start + size]]
            if state is TxnState.COMMITTED:
                batch = [real_from_half(self._half_of(e), e.half_offset) for e in entries]
                end_offset = self._append(batch)[-1].end_offset
            for entry in entries:
                self._settle(entry, state, end_offset)
        del self.groups.unfinished[group]
        return len(members), end_offset

    def undecided_groups(self, min_age_ms: int) -> list[str]:
        """Groups with a pending member stored at least ``min_age_ms`` ago, by name."""
        now = self.clock.now_ms()
        with self._lock:
            return sorted(
                group
                for group, members in self.groups.members.items()
                if group not in self.groups.unfinished
                and any(now - self.pending[h].stored_ms >= min_age_ms for h in members)
            )

    def group_decision(self, group: str) -> TxnState | None:
        """The decision recorded here on ``group``; None while it has none."""
        check_group_id(group)
        with self._lock:
            return self._group_state(group)

    def group_pending(self, group: str) -> bool:
        """True when ``group`` has pending members and no decision: another member's send needs
        no key-index lookup (the server then runs it on its event loop)."""
        return group in self.groups.members and group not in self.groups.unfinished

    def append_member(self, group: str, record: Message) -> str:
        """Store ``record`` (routed to its real topic and queue) as a half message of ``group``;
        its transaction id. For copies the broker makes itself (a transactional reject's
        dead-letter copy): the producer's checks do not apply to group members."""
        check_group_id(group)
        topic, queue_id = record.topic, record.queue_id
        message_id = record.properties.get(PROPERTY_UNIQUE_ID, "")
        record.properties[PROPERTY_TRANSACTION_GROUP] = group
        half = make_half(record, topic, queue_id, None)
        with self._lock:
            decided = self._group_state(group)
            if decided is not None:
                raise TransactionGroupEnded(
                    f"transaction group {group!r} is already {decided.value.replace('_', ' ')}"
                )
            (result,) = self._append([half])
            now = self.clock.now_ms()
            entry = PendingTxn(
                half_offset=result.commit_log_offset,
                half_end=result.end_offset,
                topic=topic,
                queue_id=queue_id,
                message_id=message_id,
                keys=(),
                producer_group=None,
                group=group,
                stored_ms=now,
                due_ms=now + self.config.timeout_ms,
            )
            self._add_pending(entry)
            self.half_next = max(self.half_next, result.queue_offset + 1)
            return entry.transaction_id

    def _group_state(self, group: str) -> TxnState | None:
        if group in self.groups.members and group not in self.groups.unfinished:
            return None  # has pending members and no decision yet
        decided = self._group_decision(group)
        return decided[0] if decided is not None else None

    def _group_decision(self, group: str) -> tuple[TxnState, int] | None:
        hit = self.groups.decided(group)
        if hit is not None:
            return hit
        state = stored_group_decision(self.store, group)
        if state is None:
            return None
        self.groups.remember(group, state, 0)
        return state, 0

    # -- checks and parking (called by the check service) -----------------------------
    def check_candidates(self, now_ms: int) -> list[int]:
        """Half offsets of PREPARED, non-group transactions due for a check at ``now_ms``."""
        with self._lock:
            due = []
            retry_ms = self.config.retry_ms
            for h, e in self.pending.items():
                if e.due_ms <= now_ms:
                    self.drop_record(
                        e
                    )  # an orphan, most likely: no need to keep its body in memory
                    if (
                        e.state is TxnState.PREPARED
                        and e.group is None
                        and (e.last_check_ms is None or e.last_check_ms + retry_ms <= now_ms)
                    ):
                        due.append(h)
            return due

    def checkable(self, half_offset: int, now_ms: int) -> PendingTxn | None:
        """The entry if it still wants a check now (decisions may have arrived meanwhile)."""
        with self._lock:
            entry = self.pending.get(half_offset)
            if entry is None or entry.state is not TxnState.PREPARED or entry.due_ms > now_ms:
                return None
            if (
                entry.last_check_ms is not None
                and entry.last_check_ms + self.config.retry_ms > now_ms
            ):
                return None  # its last check may still be answered: do not spend another
            return entry

    def check_view(self, entry: PendingTxn) -> MessageView:
        return check_view(self.read_half(entry.half_offset, entry.half_end), entry)

    def record_check(self, half_offset: int, now_ms: int) -> int | None:
        """Count a check that reached a producer; the new count (None if decided meanwhile).

        The next check waits ``config.retry_ms`` from when this one was taken
        (the later of ``now_ms`` and the clock: a long scan hands checks over
        after its start time).
        """
        with self._lock:
            entry = self.pending.get(half_offset)
            if entry is None or entry.state is not TxnState.PREPARED:
                return None
            entry.state = next_state(entry.state, TxnEvent.CHECK_SENT)
            entry.checks += 1
            entry.last_check_ms = max(now_ms, self.clock.now_ms())
            self._op_buffer.append(Op(OpKind.CHECKED, half_offset, checks=entry.checks))
            self.counters.checks_sent_total += 1
            self._dirty = True
            return entry.checks

    def forget_lost(self, half_offset: int) -> None:
        """Drop a pending transaction whose half record retention removed (it can never commit)."""
        with self._lock:
            entry = self.pending.get(half_offset)
            if entry is None:
                return
            self._remove_pending(entry)
            self.counters.lost_total += 1
            self._dirty = True
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
        with self._lock:
            if self._op_buffer:
                self._append([])

    def park(self, half_offset: int) -> bool:
        """Move a transaction that ran out of checks to the check-max topic; False if decided."""
        with self._lock:
            entry = self.pending.get(half_offset)
            if entry is None or entry.state is not TxnState.PREPARED:
                return False
            new = next_state(entry.state, TxnEvent.PARK, transaction_id=entry.transaction_id)
            half = self.read_half(entry.half_offset, entry.half_end)
            self._append(
                [
                    op_message(Op(OpKind.PARKED, half_offset, checks=entry.checks)),
                    parked_from_half(half),
                ]
            )
            entry.state = new
            self.counters.parked_total += 1
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

    def resume(self, transaction_id: str) -> TransactionInfo:
        """Put a parked transaction back under checks, its count reset; checked at the next scan."""
        half_offset = decode_transaction_id(transaction_id)
        with self._lock:
            entry = self.pending.get(half_offset)
            if entry is None:
                state, _ = self._decision_of(half_offset, transaction_id)
            else:
                state = entry.state
            new = next_state(state, TxnEvent.RESUME, transaction_id=transaction_id)
            assert entry is not None  # decided states have no RESUME move
            self._append([op_message(Op(OpKind.RESUMED, half_offset, source="operator"))])
            entry.state = new
            entry.checks = 0
            entry.last_check_ms = None
            entry.due_ms = self.clock.now_ms()
            return self._info(entry, self.clock.now_ms())

    # -- persistence -----------------------------------------------------------------
    def maybe_snapshot(self, now_ms: int) -> None:
        with self._lock:
            if self.groups.unfinished:
                for group in list(self.groups.unfinished):  # an earlier append failed: retry
                    try:
                        self.finish_group(group)
                    except Exception:
                        log.exception("event=group_finish_failed group=%s", group)
        if now_ms - self._last_snapshot_ms >= self.config.snapshot_interval_ms:
            self._last_snapshot_ms = now_ms
            self.snapshot()


__all__ = [
    "EndResult",
    "TransactionInfo",
    "TransactionService",
    "TransactionStats",
    "pending_from_half",
]
