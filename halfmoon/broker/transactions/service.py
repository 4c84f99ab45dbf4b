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
import builtins  # ``list`` is also a method of TransactionService
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from halfmoon.broker.clock import Clock
from halfmoon.broker.message import (
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_GROUP,
    MessageType,
    OutgoingMessage,
)
from halfmoon.broker.produce import PlannedMessage
from halfmoon.broker.transaction_state import TxnEvent, TxnState, next_state
from halfmoon.broker.transactions.check_state import CheckLedger
from halfmoon.broker.transactions.config import TransactionConfig
from halfmoon.broker.transactions.due_index import DueIndex
from halfmoon.broker.transactions.errors import (
    InvalidTransactionId,
    TransactionGroupEnded,
    TransactionGroupMember,
    unknown_transaction,
)
from halfmoon.broker.transactions.group_decisions import GroupDecisions
from halfmoon.broker.transactions.groups import GroupBook, check_group_id
from halfmoon.broker.transactions.ids import decode_transaction_id
from halfmoon.broker.transactions.ledger import (
    LATENCY_BUCKETS_MS,
    LIST_LIMIT,
    SNAPSHOT_COST_FACTOR,
    TransactionInfo,
    TransactionLedger,
    TransactionStats,
)
from halfmoon.broker.transactions.oplog import HALF_TOPIC, Op, OpKind, op_message
from halfmoon.broker.transactions.records import (
    PendingTxn,
    make_half,
    pending_from_half,
    real_from_half,
)
from halfmoon.broker.transactions.recovery import Recovered, real_exists, recover
from halfmoon.broker.transactions.resolutions import DecisionSource, Resolution
from halfmoon.errors import HalfmoonError, NotFound
from halfmoon.store.api import AppendResult, Store
from halfmoon.store.message import Message

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EndRequest:
    """One decision for :meth:`TransactionService.end_many` (an EndTransaction's fields)."""

    transaction_id: str
    resolution: Resolution
    source: DecisionSource = DecisionSource.CLIENT
    message_id: str = ""  # when given, must be the transaction's
    topic: str = ""  # likewise


@dataclass(frozen=True)
class EndResult:
    state: TxnState  # the transaction's state after the call
    end_offset: int  # await store.durable(end_offset) before acknowledging (0: nothing to wait for)
    changed: bool  # False for a repeated decision or UNKNOWN


class TransactionService:
    """Half messages, decisions and transaction groups over the ledger it holds; the check
    service's steps over the same ledger are :attr:`checks`."""

    def __init__(
        self,
        store: Store,
        metadata_dir: Path | None,
        config: TransactionConfig,
        clock: Clock,
    ) -> None:
        snapshot_file = TransactionLedger.SNAPSHOT_FILE
        path = metadata_dir / snapshot_file if metadata_dir is not None else None
        recovered = recover(store, path, config)
        self.ledger = TransactionLedger(store, path, config, clock, recovered)
        self.checks = CheckLedger(self.ledger)
        self.group_decisions = GroupDecisions(self.ledger)
        self._finish_recovery(recovered)

    # -- what the broker and the check service read of the ledger --------------------
    @property
    def config(self) -> TransactionConfig:
        return self.ledger.config

    @property
    def clock(self) -> Clock:
        return self.ledger.clock

    @property
    def pending(self) -> dict[int, PendingTxn]:
        return self.ledger.pending

    @property
    def due(self) -> DueIndex:
        return self.ledger.due

    @property
    def groups(self) -> GroupBook:
        return self.ledger.groups

    @property
    def counters(self) -> TransactionStats:
        return self.ledger.counters

    @property
    def trace(self) -> Callable[..., None] | None:
        """The message trace (halfmoon/broker/trace.py), which the broker sets."""
        return self.ledger.trace

    @trace.setter
    def trace(self, trace: Callable[..., None] | None) -> None:
        self.ledger.trace = trace

    def list(
        self,
        *,
        topic: str | None = None,
        state: TxnState | None = None,
        limit: int = LIST_LIMIT,
        next_check: Callable[[PendingTxn], int | None] | None = None,
    ) -> list[TransactionInfo]:
        return self.ledger.list(topic=topic, state=state, limit=limit, next_check=next_check)

    def stats(self) -> TransactionStats:
        return self.ledger.stats()

    def snapshot(self) -> None:
        self.ledger.snapshot()

    def close(self) -> None:
        self.ledger.close()

    def _finish_recovery(self, recovered: Recovered) -> None:
        """Complete the group commits a crash cut short; snapshot when anything was replayed."""
        finished = 0
        with self.ledger.lock:
            for group in list(self.ledger.groups.unfinished):
                finished += self.group_decisions.finish_group(group)[0]
            self.ledger.counters.redone_commits_total += finished
        if recovered.replayed:
            self.ledger.dirty = True
            self.ledger.snapshot()
        log.info(
            "event=transactions_recovered pending=%d committed_since_snapshot=%d "
            "group_members_finished=%d",
            len(self.ledger.pending),
            recovered.committed,
            finished,
        )

    # -- the send path ---------------------------------------------------------------
    def append(
        self, messages: Sequence[OutgoingMessage], planned: Sequence[PlannedMessage]
    ) -> tuple[builtins.list[AppendResult], builtins.list[str | None]]:
        """Store a batch with TRANSACTION messages as half records; the rest as planned.

        Returns the append results and, per message, its transaction id (None
        for the non-transactional ones). All or nothing, like ``store.append``.
        """
        cap_s = self.ledger.config.max_immunity_ms // 1000
        timeout_ms = self.ledger.config.timeout_ms
        records: list[Message] = []
        halves: list[int] = []
        delays: list[int] = []  # per half: its first check, after its immunity or the timeout
        groups: set[str] = set()
        for index, (msg, plan) in enumerate(zip(messages, planned, strict=True)):
            if msg.message_type is not MessageType.TRANSACTION:
                records.append(plan.record)
                continue
            group = msg.transaction_group
            if group is not None and group not in groups:
                check_group_id(group)
                groups.add(group)
            if msg.transaction_timeout_ms is not None:
                self.group_decisions.check_group_timeout(msg)
            immunity = msg.check_immunity_seconds
            if immunity is not None:
                immunity = min(max(immunity, 0), cap_s)
            records.append(make_half(plan.record, plan.topic, plan.queue_id, immunity))
            halves.append(index)
            # What immunity_ms_of reads back from the half record, without parsing it again.
            delays.append(immunity * 1000 if immunity else timeout_ms)
        ids: list[str | None] = [None] * len(records)
        with self.ledger.lock:
            for group in groups:
                decided = self.group_decisions.state(group)
                if decided is not None:
                    raise TransactionGroupEnded(
                        f"transaction group {group!r} is already "
                        f"{decided.value.replace('_', ' ')}; "
                        "a late member would break its all-or-nothing: send it with a new group id"
                    )
            results = self.ledger.write(records)
            now = self.ledger.clock.now_ms()
            half_next = self.ledger.half_next
            for index, delay in zip(halves, delays, strict=True):
                result = results[index]
                plan, msg = planned[index], messages[index]
                entry = PendingTxn(
                    half_offset=result.commit_log_offset,
                    half_end=result.end_offset,
                    topic=plan.topic,
                    queue_id=plan.queue_id,
                    message_id=plan.message_id,
                    keys=tuple(msg.keys),
                    producer_group=msg.producer_group,
                    group=msg.transaction_group,
                    stored_ms=now,
                    due_ms=now + delay,
                    deadline_ms=now
                    + (msg.transaction_timeout_ms or self.ledger.config.group_timeout_ms)
                    if msg.transaction_group is not None
                    else None,
                )
                self.ledger.keep_record(entry, records[index])
                self.ledger.add_pending(entry)
                half_next = max(half_next, result.queue_offset + 1)
                ids[index] = entry.transaction_id
                self.ledger.traced(
                    entry, "half_stored", producer_group=entry.producer_group,
                    transaction_group=entry.group,
                )  # fmt: skip
            self.ledger.half_next = half_next
        return results, ids

    # -- decisions -------------------------------------------------------------------
    def end(
        self,
        transaction_id: str,
        resolution: Resolution,
        source: DecisionSource = DecisionSource.CLIENT,
        *,
        message_id: str = "",
        topic: str = "",
    ) -> EndResult:
        """Apply a producer's, a check answer's or an operator's decision (see the module docs)."""
        (result,) = self.end_many(
            [EndRequest(transaction_id, resolution, source, message_id, topic)]
        )
        if isinstance(result, HalfmoonError):
            raise result
        return result

    def end_many(self, requests: Sequence[EndRequest]) -> builtins.list[EndResult | HalfmoonError]:
        """Apply many decisions with one store append: a group commit of decisions.

        Each request is judged as :meth:`end` judges one, in order (a later
        request for the same transaction sees the earlier one's decision); an
        error is returned in the request's place and leaves the others alone.
        The records of every decision that changes a state go to the store in
        one append, which is all or nothing: when it fails the call raises and
        nothing changed. Each result carries the end offset of its own record
        (a repeat within the batch: the first one's), to wait for before
        acknowledging.
        """
        judged: list[tuple[Resolution, DecisionSource, int] | HalfmoonError] = []
        for request in requests:
            try:
                resolution = Resolution.of(request.resolution)
                source = DecisionSource.of(request.source)
                judged.append((resolution, source, decode_transaction_id(request.transaction_id)))
            except HalfmoonError as exc:
                judged.append(exc)
                continue
            if self.ledger.on_end is not None:
                self.ledger.on_end(request.transaction_id)
        out: list[EndResult | HalfmoonError | None] = [None] * len(requests)
        with self.ledger.lock:
            records: list[Message] = []
            deciding: list[tuple[int, PendingTxn, TxnState, DecisionSource]] = []  # a record each
            planned: dict[int, tuple[TxnState, int]] = {}  # half offset -> (state, its record)
            repeats: list[tuple[int, TxnState, int]] = []  # (request, state, record)
            for index, (request, parsed) in enumerate(zip(requests, judged, strict=True)):
                if isinstance(parsed, HalfmoonError):
                    out[index] = parsed
                    continue
                resolution, source, half_offset = parsed
                event = resolution.event
                tid = request.transaction_id
                try:
                    if half_offset in planned:
                        state, record = planned[half_offset]
                        repeats.append(
                            (index, next_state(state, event, transaction_id=tid), record)
                        )
                        continue
                    decision = self._judge(request, resolution, source, half_offset)
                    if isinstance(decision, EndResult):
                        out[index] = decision
                        continue
                    entry, new = decision
                    records.append(self._decision_record(entry, new, source))
                except HalfmoonError as exc:
                    out[index] = exc
                    continue
                planned[half_offset] = (new, len(deciding))
                deciding.append((index, entry, new, source))
            if records:
                results = self.ledger.write(records)
                for (index, entry, new, source), result in zip(deciding, results, strict=True):
                    self._settle(entry, new, result.end_offset)
                    self.ledger.traced(entry, new.value, source=source.decider)
                    out[index] = EndResult(new, result.end_offset, True)
                for index, state, record in repeats:
                    out[index] = EndResult(state, results[record].end_offset, False)
        return cast(list[EndResult | HalfmoonError], out)

    def _judge(
        self,
        request: EndRequest,
        resolution: Resolution,
        source: DecisionSource,
        half_offset: int,
    ) -> EndResult | tuple[PendingTxn, TxnState]:
        """What ``request`` does: an answer that changes nothing, or (entry, its new state).
        Raises the request's error. Locked."""
        tid, event = request.transaction_id, resolution.event
        entry = self.ledger.pending.get(half_offset)
        if entry is not None and entry.group in self.ledger.groups.unfinished:
            self.group_decisions.finish_group(entry.group)  # its group is decided
            entry = None
        message_id, topic = request.message_id, request.topic
        if entry is None:
            if topic and self._real_topic(half_offset) not in (None, topic):
                raise unknown_transaction(tid)
            state, end_offset = self._decision_of(half_offset, tid)
            return EndResult(next_state(state, event, transaction_id=tid), end_offset, False)
        # The caller was authorized on the topic it named: a transaction of another topic is,
        # to it, one that does not exist (the answer names neither that topic nor its message).
        if topic and topic != entry.topic:
            raise unknown_transaction(tid)
        if message_id and message_id != entry.message_id:
            raise InvalidTransactionId(
                f"transaction {tid!r} belongs to message {entry.message_id!r}, "
                f"not to {message_id!r}"
            )
        if entry.group is not None and event is not TxnEvent.UNKNOWN:
            # Not named: transaction ids are positions anyone can compute, and a group's id
            # lets its holder add to the group (the operator sees it in transaction list).
            raise TransactionGroupMember(
                f"transaction {tid!r} is a member of a transaction group: it is committed or "
                "rolled back with its group (end the group, hm-group:<id>, instead)"
            )
        new = next_state(entry.state, event, transaction_id=tid)
        if source is DecisionSource.CHECK:
            self.ledger.counters.checks_answered_total += 1
            self.ledger.traced(entry, "check_answered", resolution=resolution.value)
        if new is entry.state:
            return EndResult(new, 0, False)
        return entry, new

    def ends_cheaply(self, transaction_id: str) -> bool:
        """True when :meth:`end` for this id needs no index lookup: pending (not a group member)
        or recently decided, or not an id at all (refused at once). The broker then decides it
        on the caller's thread, an event loop's too (the rest needs a worker thread).
        """
        try:
            half_offset = decode_transaction_id(transaction_id)
        except InvalidTransactionId:
            return True
        entry = self.ledger.pending.get(half_offset)
        if entry is not None:
            return entry.group is None
        return half_offset in self.ledger.decided

    def _decision_record(
        self, entry: PendingTxn, state: TxnState, source: DecisionSource
    ) -> Message:
        """The record of a decision: a commit's real message (the commit record), or a
        rollback's op. Locked."""
        if state is TxnState.COMMITTED:
            return real_from_half(self.ledger.half_of(entry), entry.half_offset)
        return op_message(Op(OpKind.ROLLBACK, entry.half_offset, source=source))

    def _settle(self, entry: PendingTxn, state: TxnState, end_offset: int) -> None:
        self.ledger.remove_pending(entry)
        self.remember(entry.half_offset, state, end_offset)
        if state is TxnState.COMMITTED:
            self.ledger.counters.committed_total += 1
        else:
            self.ledger.counters.rolled_back_total += 1
        self.ledger.latency[
            bisect.bisect_left(LATENCY_BUCKETS_MS, self.ledger.clock.now_ms() - entry.stored_ms)
        ] += 1

    def remember(self, half_offset: int, state: TxnState, end_offset: int) -> None:
        self.ledger.decided[half_offset] = (state, end_offset)
        self.ledger.decided.move_to_end(half_offset)
        while len(self.ledger.decided) > self.ledger.config.decided_cache_entries:
            self.ledger.decided.popitem(last=False)

    def _real_topic(self, half_offset: int) -> str | None:
        """The topic the half message at ``half_offset`` was sent to; None when no half
        message is stored there (any more)."""
        try:
            half = self.ledger.store.read_at(half_offset)
        except NotFound:
            return None
        if half is None or half.topic != HALF_TOPIC:
            return None
        return half.properties.get(PROPERTY_REAL_TOPIC)

    def _decision_of(self, half_offset: int, transaction_id: str) -> tuple[TxnState, int]:
        """The decision on a transaction that is not pending: cache, op key index, its group."""
        hit = self.ledger.decided.get(half_offset)
        if hit is not None:
            return hit
        try:
            half = self.ledger.store.read_at(half_offset)
        except NotFound:
            half = None
        if half is None or half.topic != HALF_TOPIC:
            raise unknown_transaction(transaction_id)
        group = half.properties.get(PROPERTY_TRANSACTION_GROUP)
        decided = self.group_decisions.decided(group) if group else None
        if decided is not None:
            return decided
        # Not pending, so decided. The half record is still stored, hence so is a commit's
        # real message (appended after it; retention removes the oldest first).
        topic, message_id = half.properties.get(PROPERTY_REAL_TOPIC, ""), half.unique_id or ""
        committed = real_exists(self.ledger.store, topic, message_id, half_offset)
        state = TxnState.COMMITTED if committed else TxnState.ROLLED_BACK
        self.remember(half_offset, state, 0)
        return state, 0

    # -- transaction groups (group_decisions.py) ----------------------------------------
    def end_group(
        self,
        group: str,
        resolution: Resolution,
        source: DecisionSource = DecisionSource.CLIENT,
        *,
        body: bytes = b"",
    ) -> tuple[int, int]:
        return self.group_decisions.end_group(group, resolution, source, body=body)

    def undecided_groups(self, min_age_ms: int) -> builtins.list[str]:
        return self.group_decisions.undecided_groups(min_age_ms)

    def expired_groups(self, now_ms: int) -> builtins.list[str]:
        return self.group_decisions.expired_groups(now_ms)

    def group_decision(self, group: str) -> TxnState | None:
        return self.group_decisions.group_decision(group)

    def group_pending(self, group: str) -> bool:
        return self.group_decisions.group_pending(group)

    def append_member(self, group: str, record: Message) -> str:
        return self.group_decisions.append_member(group, record)

    # -- parked transactions (the check service side: :mod:`check_state`) --------------
    def resume(self, transaction_id: str) -> TransactionInfo:
        """Put a parked transaction back under checks, its count reset; checked at the next scan."""
        half_offset = decode_transaction_id(transaction_id)
        with self.ledger.lock:
            entry = self.ledger.pending.get(half_offset)
            if entry is None:
                state, _ = self._decision_of(half_offset, transaction_id)
            else:
                state = entry.state
            new = next_state(state, TxnEvent.RESUME, transaction_id=transaction_id)
            assert entry is not None  # decided states have no RESUME move
            self.ledger.write(
                [op_message(Op(OpKind.RESUMED, half_offset, source=DecisionSource.OPERATOR))]
            )
            entry.state = new
            entry.checks = 0
            entry.last_check_ms = None
            entry.due_ms = self.ledger.clock.now_ms()
            self.ledger.index_for_checks(entry)
            self.ledger.traced(entry, "resumed", source=DecisionSource.OPERATOR.decider)
            return self.ledger.info(entry, self.ledger.clock.now_ms())

    # -- persistence -----------------------------------------------------------------
    def maybe_snapshot(self, now_ms: int) -> None:
        with self.ledger.lock:
            if self.ledger.groups.unfinished:
                for group in list(self.ledger.groups.unfinished):  # an earlier append failed: retry
                    try:
                        self.group_decisions.finish_group(group)
                    except Exception:
                        log.exception("event=group_finish_failed group=%s", group)
        wait_ms = max(
            self.ledger.config.snapshot_interval_ms,
            SNAPSHOT_COST_FACTOR * self.ledger.snapshot_cost_ms,
        )
        if now_ms - self.ledger.last_snapshot_ms >= wait_ms:
            self.ledger.last_snapshot_ms = now_ms
            self.ledger.snapshot()


__all__ = [
    "EndRequest",
    "EndResult",
    "TransactionInfo",
    "TransactionService",
    "TransactionStats",
    "pending_from_half",
]
