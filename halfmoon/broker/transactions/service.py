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
from halfmoon.broker.transactions.errors import (
    InvalidTransactionId,
    TransactionGroupEnded,
    TransactionGroupMember,
)
from halfmoon.broker.transactions.groups import check_group_id
from halfmoon.broker.transactions.ids import decode_transaction_id
from halfmoon.broker.transactions.ledger import (
    LATENCY_BUCKETS_MS,
    SNAPSHOT_COST_FACTOR,
    TransactionInfo,
    TransactionStats,
)
from halfmoon.broker.transactions.oplog import HALF_TOPIC, Op, OpKind, op_message
from halfmoon.broker.transactions.records import (
    PendingTxn,
    make_half,
    pending_from_half,
    real_from_half,
)
from halfmoon.broker.transactions.recovery import (
    Recovered,
    real_exists,
    recover,
    stored_group_decision,
)
from halfmoon.errors import HalfmoonError, InvalidArgument, NotFound
from halfmoon.store.api import AppendResult, Store
from halfmoon.store.message import PROPERTY_UNIQUE_ID, Message

log = logging.getLogger(__name__)

RESOLUTIONS = {
    "commit": TxnEvent.COMMIT,
    "rollback": TxnEvent.ROLLBACK,
    "unknown": TxnEvent.UNKNOWN,
}
SOURCES = ("client", "check", "operator")
# Who made a decision, as the message trace says it.
DECIDERS = {"client": "producer", "check": "check", "operator": "operator"}


@dataclass(frozen=True, slots=True)
class EndRequest:
    """One decision for :meth:`TransactionService.end_many` (an EndTransaction's fields)."""

    transaction_id: str
    resolution: str  # commit, rollback or unknown
    source: str = "client"  # client, check or operator
    message_id: str = ""  # when given, must be the transaction's
    topic: str = ""  # likewise


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


class TransactionService(CheckLedger):
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
        timeout_ms = self.config.timeout_ms
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
            immunity = msg.check_immunity_seconds
            if immunity is not None:
                immunity = min(max(immunity, 0), cap_s)
            records.append(make_half(plan.record, plan.topic, plan.queue_id, immunity))
            halves.append(index)
            # What immunity_ms_of reads back from the half record, without parsing it again.
            delays.append(immunity * 1000 if immunity else timeout_ms)
        ids: list[str | None] = [None] * len(records)
        with self._lock:
            for group in groups:
                decided = self._group_state(group)
                if decided is not None:
                    raise TransactionGroupEnded(
                        f"transaction group {group!r} is already "
                        f"{decided.value.replace('_', ' ')}; "
                        "a late member would break its all-or-nothing: send it with a new group id"
                    )
            results = self._append(records)
            now = self.clock.now_ms()
            half_next = self.half_next
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
                )
                self.keep_record(entry, records[index])
                self._add_pending(entry)
                half_next = max(half_next, result.queue_offset + 1)
                ids[index] = entry.transaction_id
                self._trace(
                    entry, "half_stored", producer_group=entry.producer_group,
                    transaction_group=entry.group,
                )  # fmt: skip
            self.half_next = half_next
        return results, ids

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
        (result,) = self.end_many(
            [EndRequest(transaction_id, resolution, source, message_id, topic)]
        )
        if isinstance(result, HalfmoonError):
            raise result
        return result

    def end_many(self, requests: Sequence[EndRequest]) -> list[EndResult | HalfmoonError]:
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
        judged: list[tuple[TxnEvent, int] | HalfmoonError] = []
        for request in requests:
            try:
                event = _event(request.resolution)
                _check_source(request.source)
                judged.append((event, decode_transaction_id(request.transaction_id)))
            except HalfmoonError as exc:
                judged.append(exc)
                continue
            if self.on_end is not None:
                self.on_end(request.transaction_id)
        out: list[EndResult | HalfmoonError | None] = [None] * len(requests)
        with self._lock:
            records: list[Message] = []
            deciding: list[tuple[int, PendingTxn, TxnState, str]] = []  # one per record
            planned: dict[int, tuple[TxnState, int]] = {}  # half offset -> (state, its record)
            repeats: list[tuple[int, TxnState, int]] = []  # (request, state, record)
            for index, (request, parsed) in enumerate(zip(requests, judged, strict=True)):
                if isinstance(parsed, HalfmoonError):
                    out[index] = parsed
                    continue
                event, half_offset = parsed
                tid = request.transaction_id
                try:
                    if half_offset in planned:
                        state, record = planned[half_offset]
                        repeats.append(
                            (index, next_state(state, event, transaction_id=tid), record)
                        )
                        continue
                    decision = self._judge(request, event, half_offset)
                    if isinstance(decision, EndResult):
                        out[index] = decision
                        continue
                    entry, new = decision
                    records.append(self._decision_record(entry, new, request.source))
                except HalfmoonError as exc:
                    out[index] = exc
                    continue
                planned[half_offset] = (new, len(deciding))
                deciding.append((index, entry, new, request.source))
            if records:
                results = self._append(records)
                for (index, entry, new, source), result in zip(deciding, results, strict=True):
                    self._settle(entry, new, result.end_offset)
                    self._trace(entry, new.value, source=DECIDERS[source])
                    out[index] = EndResult(new, result.end_offset, True)
                for index, state, record in repeats:
                    out[index] = EndResult(state, results[record].end_offset, False)
        return cast(list[EndResult | HalfmoonError], out)

    def _judge(
        self, request: EndRequest, event: TxnEvent, half_offset: int
    ) -> EndResult | tuple[PendingTxn, TxnState]:
        """What ``request`` does: an answer that changes nothing, or (entry, its new state).
        Raises the request's error. Locked."""
        tid = request.transaction_id
        entry = self.pending.get(half_offset)
        if entry is not None and entry.group in self.groups.unfinished:
            self.finish_group(entry.group)  # its group is decided
            entry = None
        if entry is None:
            state, end_offset = self._decision_of(half_offset, tid)
            return EndResult(next_state(state, event, transaction_id=tid), end_offset, False)
        message_id, topic = request.message_id, request.topic
        if (message_id and message_id != entry.message_id) or (topic and topic != entry.topic):
            raise InvalidTransactionId(
                f"transaction {tid!r} belongs to message {entry.message_id!r} "
                f"of topic {entry.topic!r}, not to {message_id or '?'!r} of {topic or '?'!r}"
            )
        if entry.group is not None and event is not TxnEvent.UNKNOWN:
            raise TransactionGroupMember(
                f"transaction {tid!r} is a member of transaction group {entry.group!r}: "
                "it is committed or rolled back with its group (end the group instead)"
            )
        new = next_state(entry.state, event, transaction_id=tid)
        if request.source == "check":
            self._trace(entry, "check_answered", resolution=request.resolution.lower())
        if new is entry.state:
            return EndResult(new, 0, False)
        return entry, new

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

    def _decision_record(self, entry: PendingTxn, state: TxnState, source: str) -> Message:
        """The record of a decision: a commit's real message (the commit record), or a
        rollback's op. Locked."""
        if state is TxnState.COMMITTED:
            return real_from_half(self._half_of(entry), entry.half_offset)
        return op_message(Op(OpKind.ROLLBACK, entry.half_offset, source=source))

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
        """Complete the members of a decided group still pending. Locked.

        Per member only what is its own: its real message (one store append per
        ``group_batch_size``), leaving the pending set and the decided cache, a trace event.
        The group's bookkeeping (its member set, counters, latency) is done once per batch.
        """
        state = self.groups.unfinished[group]
        members = sorted(self.groups.members.get(group, ()))
        size = self.config.group_batch_size
        end_offset = 0
        committed = state is TxnState.COMMITTED
        for start in range(0, len(members), size):
            entries = [self.pending[h] for h in members[start : start + size]]
            if committed:
                batch = [
                    real_from_half(self._half_of(e), e.half_offset, e.transaction_id)
                    for e in entries
                ]
                end_offset = self._append(batch)[-1].end_offset
            self._settle_members(group, entries, state, end_offset)
        del self.groups.unfinished[group]
        return len(members), end_offset

    def _settle_members(
        self, group: str, entries: list[PendingTxn], state: TxnState, end_offset: int
    ) -> None:
        """:meth:`_settle` for a batch of one group's members (their records are appended)."""
        pending, decided, now = self.pending, self._decided, self.clock.now_ms()
        latency = self._latency
        for entry in entries:
            del pending[entry.half_offset]
            self.drop_record(entry)
            self.due.discard(entry)  # members are not checked: a no-op unless indexed
            decided[entry.half_offset] = (state, end_offset)
            latency[bisect.bisect_left(LATENCY_BUCKETS_MS, now - entry.stored_ms)] += 1
            self._trace(entry, state.value, source="group", group=group)
        self.groups.remove_members(group, [e.half_offset for e in entries])
        while len(decided) > self.config.decided_cache_entries:
            decided.popitem(last=False)
        if state is TxnState.COMMITTED:
            self.counters.committed_total += len(entries)
        else:
            self.counters.rolled_back_total += len(entries)

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

    # -- parked transactions (the check service side: :mod:`check_state`) --------------
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
            self._index_for_checks(entry)
            self._trace(entry, "resumed", source="operator")
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
        wait_ms = max(
            self.config.snapshot_interval_ms, SNAPSHOT_COST_FACTOR * self.snapshot_cost_ms
        )
        if now_ms - self._last_snapshot_ms >= wait_ms:
            self._last_snapshot_ms = now_ms
            self.snapshot()


__all__ = [
    "EndRequest",
    "EndResult",
    "TransactionInfo",
    "TransactionService",
    "TransactionStats",
    "pending_from_half",
]
