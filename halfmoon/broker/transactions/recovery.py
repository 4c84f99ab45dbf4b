"""Rebuild the transaction service's memory when the broker opens.

1. Load ``transactions.json`` (if any): the pending set as of a snapshot and
   the half / op queue offsets it covers. Each pending half record is re-read
   (one read per undecided transaction). No snapshot: start from each queue's
   retained minimum.
2. Replay the half queue from the snapshot's half offset: every half record
   after it is pending until something says otherwise.
3. Replay the op queue from the snapshot's op offset: rollbacks remove
   transactions, ``checked`` / ``parked`` / ``resumed`` restore check counts
   and parking, group ops record group decisions (a group rollback removes its
   members).
4. Commits leave no op (the real message is the commit record), so for each
   transaction still pending, ask the key index for a record of its real
   topic with its message id whose ``prepared_transaction_offset`` is its half
   offset: found means committed.
5. A decided group with members still pending (a crash in the middle of a
   group commit) is marked unfinished.

:func:`recover` only reads: it returns a :class:`Recovered` state that the
service adopts. The service then finishes the unfinished groups (appending the
missing real messages) and, when anything was replayed, writes a fresh
snapshot, so the next start begins from here.

The cost is one read and one key-index lookup per pending transaction plus
the records appended since the last snapshot
(``transaction.snapshot_interval_ms``, 5 s by default).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from halfmoon.broker.config import read_json
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions.config import TransactionConfig
from halfmoon.broker.transactions.groups import GroupBook
from halfmoon.broker.transactions.oplog import (
    HALF_TOPIC,
    OP_TOPIC,
    QUEUE_ID,
    Op,
    OpKind,
    group_key,
    parse_op,
)
from halfmoon.broker.transactions.records import PendingTxn, pending_from_half
from halfmoon.errors import NotFound
from halfmoon.store.api import GetStatus, Store
from halfmoon.store.message import StoredMessage

log = logging.getLogger(__name__)

_READ_BATCH = 256


def read_queue(store: Store, topic: str, start: int) -> Iterator[StoredMessage]:
    """Every record of ``topic`` queue 0 from queue offset ``start`` (skips what retention
    removed)."""
    offset = start
    while True:
        result = store.get(topic, QUEUE_ID, offset, _READ_BATCH)
        if result.status is GetStatus.OFFSET_TOO_SMALL:
            log.error(
                "event=transaction_records_expired topic=%s from=%d to=%d",
                topic,
                offset,
                result.next_offset,
            )
            offset = result.next_offset
            continue
        if not result.messages:
            if result.next_offset > offset and result.status is GetStatus.NO_MATCHED_MESSAGE:
                offset = result.next_offset  # unreadable entries skipped by the store
                continue
            return
        yield from result.messages
        offset = result.next_offset


def real_exists(store: Store, topic: str, message_id: str, half_offset: int) -> bool:
    """True when the commit of the half record at ``half_offset`` reached its real topic."""
    if not message_id:
        return False
    return any(
        m.prepared_transaction_offset == half_offset
        for m in store.query_by_key(topic, message_id, max_results=64)
    )


def stored_group_decision(store: Store, group: str) -> TxnState | None:
    """The decision of ``group`` as its op record in the op topic says; None if undecided."""
    for stored in store.query_by_key(OP_TOPIC, group_key(group), max_results=8):
        op = parse_op(stored)
        if (
            op is not None
            and op.group == group
            and op.kind in (OpKind.GROUP_COMMIT, OpKind.GROUP_ROLLBACK)
        ):
            return TxnState.COMMITTED if op.kind is OpKind.GROUP_COMMIT else TxnState.ROLLED_BACK
    return None


@dataclass
class Recovered:
    """The transaction service's memory as the store says it was: what the service adopts."""

    decided_cache_entries: int
    pending: dict[int, PendingTxn] = field(default_factory=dict)
    groups: GroupBook = field(init=False)
    # half offset -> (decision, end offset of its record), most recent last; bounded
    decided: OrderedDict[int, tuple[TxnState, int]] = field(default_factory=OrderedDict)
    half_next: int = 0
    op_next: int = 0
    replayed: bool = False  # records were read past the snapshot: write a new one
    committed: int = 0  # transactions found committed since the snapshot

    def __post_init__(self) -> None:
        self.groups = GroupBook(self.decided_cache_entries)

    def add(self, entry: PendingTxn) -> None:
        self.pending[entry.half_offset] = entry
        if entry.group is not None:
            self.groups.add_member(entry.group, entry.half_offset, entry.deadline_ms)

    def remove(self, entry: PendingTxn) -> None:
        self.pending.pop(entry.half_offset, None)
        if entry.group is not None:
            self.groups.remove_member(entry.group, entry.half_offset)

    def remember(self, half_offset: int, state: TxnState) -> None:
        self.decided[half_offset] = (state, 0)
        self.decided.move_to_end(half_offset)
        while len(self.decided) > self.decided_cache_entries:
            self.decided.popitem(last=False)


def recover(store: Store, path: Path | None, config: TransactionConfig) -> Recovered:
    """Read the snapshot at ``path`` (None: none kept) and the queues after it; see the module
    docs."""
    state = Recovered(config.decided_cache_entries)
    data = read_json(path) if path is not None else None
    if isinstance(data, dict) and data.get("version") == 1:
        half_next = int(data["half_next"])
        op_next = int(data["op_next"])
        for half_offset, checks, parked in data.get("pending", []):
            try:
                half = store.read_at(int(half_offset))
            except NotFound:
                log.error(
                    "event=half_message_lost half_offset=%s: removed before a decision", half_offset
                )
                state.replayed = True
                continue
            entry = pending_from_half(
                half, half.store_timestamp, config.timeout_ms, config.group_timeout_ms
            )
            if entry is None:
                continue
            entry.checks = int(checks)
            if parked:
                entry.state = TxnState.PARKED
            state.add(entry)
    else:
        half_next = store.min_offset(HALF_TOPIC, QUEUE_ID)
        op_next = store.min_offset(OP_TOPIC, QUEUE_ID)

    for half in read_queue(store, HALF_TOPIC, half_next):
        half_next = half.queue_offset + 1
        state.replayed = True
        entry = pending_from_half(
            half, half.store_timestamp, config.timeout_ms, config.group_timeout_ms
        )
        if entry is None:
            log.error("event=bad_half_record offset=%d", half.commit_log_offset)
            continue
        state.add(entry)

    for stored in read_queue(store, OP_TOPIC, op_next):
        op_next = stored.queue_offset + 1
        state.replayed = True
        op = parse_op(stored)
        if op is None:
            log.error("event=bad_op_record offset=%d", stored.commit_log_offset)
            continue
        _apply(state, op, stored)
    state.half_next = half_next
    state.op_next = op_next

    for entry in list(state.pending.values()):
        if real_exists(store, entry.topic, entry.message_id, entry.half_offset):
            state.remove(entry)
            state.remember(entry.half_offset, TxnState.COMMITTED)
            state.committed += 1
    for group in list(state.groups.members):
        decided = state.groups.decided(group)
        if decided is None:
            found = stored_group_decision(store, group)
            if found is not None:
                state.groups.remember(group, found, 0)
                decided = (found, 0)
        if decided is not None:
            log.warning(
                "event=group_decision_resumed group=%s decision=%s", group, decided[0].value
            )
            state.groups.unfinished[group] = decided[0]
    return state


def _apply(state: Recovered, op: Op, stored: StoredMessage) -> None:
    entry = state.pending.get(op.half_offset)
    kind = op.kind
    if kind in (OpKind.COMMIT, OpKind.ROLLBACK):
        decision = TxnState.COMMITTED if kind is OpKind.COMMIT else TxnState.ROLLED_BACK
        if entry is not None:
            state.remove(entry)
        state.remember(op.half_offset, decision)
    elif kind in (OpKind.GROUP_COMMIT, OpKind.GROUP_ROLLBACK) and op.group is not None:
        decision = TxnState.COMMITTED if kind is OpKind.GROUP_COMMIT else TxnState.ROLLED_BACK
        state.groups.remember(op.group, decision, 0)
        if decision is TxnState.ROLLED_BACK:  # a group rollback writes nothing per member
            for half_offset in list(state.groups.members.get(op.group, ())):
                state.remove(state.pending[half_offset])
                state.remember(half_offset, decision)
        # A group commit's members are settled by their real messages (step 4); members
        # left pending after that were cut off by a crash (step 5).
    elif entry is None:
        return  # a check or park record of a transaction decided since
    elif kind is OpKind.CHECKED and entry.state is TxnState.PREPARED:
        entry.checks = op.checks
    elif kind is OpKind.PARKED:
        entry.state = TxnState.PARKED
        entry.checks = op.checks
    elif kind is OpKind.RESUMED:
        entry.state = TxnState.PREPARED
        entry.checks = 0
        entry.due_ms = stored.store_timestamp
