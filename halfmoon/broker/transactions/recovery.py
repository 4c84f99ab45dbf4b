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
   group commit) is finished: the missing real messages are appended.
6. When anything was replayed, a fresh snapshot is written, so the next start
   begins from here.

The cost is one read and one key-index lookup per pending transaction plus
the records appended since the last snapshot
(``transaction.snapshot_interval_ms``, 5 s by default).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from halfmoon.broker.config import read_json
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions.oplog import (
    HALF_TOPIC,
    OP_TOPIC,
    QUEUE_ID,
    Op,
    OpKind,
    parse_op,
)
from halfmoon.broker.transactions.records import pending_from_half
from halfmoon.errors import NotFound
from halfmoon.store.api import GetStatus, Store
from halfmoon.store.message import StoredMessage

if TYPE_CHECKING:
    from halfmoon.broker.transactions.service import TransactionService

log = logging.getLogger(__name__)

_READ_BATCH = 256


def read_queue(store: Store, topic: str, start: int) -> Iterator[StoredMessage]:
    """Every record of ``topic`` queue 0 from queue offset ``start`` (skips what retention removed)."""
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


def recover(service: TransactionService) -> None:
    store, config = service.store, service.config
    data = read_json(service._path) if service._path is not None else None
    replayed = False
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
                replayed = True
                continue
            entry = pending_from_half(half, half.store_timestamp, config.timeout_ms)
            if entry is None:
                continue
            entry.checks = int(checks)
            if parked:
                entry.state = TxnState.PARKED
            service._add_pending(entry)
    else:
        half_next = store.min_offset(HALF_TOPIC, QUEUE_ID)
        op_next = store.min_offset(OP_TOPIC, QUEUE_ID)

    for half in read_queue(store, HALF_TOPIC, half_next):
        half_next = half.queue_offset + 1
        replayed = True
        entry = pending_from_half(half, half.store_timestamp, config.timeout_ms)
        if entry is None:
            log.error("event=bad_half_record offset=%d", half.commit_log_offset)
            continue
        service._add_pending(entry)

    for stored in read_queue(store, OP_TOPIC, op_next):
        op_next = stored.queue_offset + 1
        replayed = True
        op = parse_op(stored)
        if op is None:
            log.error("event=bad_op_record offset=%d", stored.commit_log_offset)
            continue
        _apply(service, op, stored)
    service.half_next = half_next
    service.op_next = op_next

    committed = 0
    with service._lock:
        for entry in list(service.pending.values()):
            if real_exists(store, entry.topic, entry.message_id, entry.half_offset):
                service._remove_pending(entry)
                service.remember(entry.half_offset, TxnState.COMMITTED, 0)
                committed += 1
        finished = 0
        for group in list(service.groups.members):
            decided = service._group_decision(group)
            if decided is not None:
                log.warning(
                    "event=group_decision_resumed group=%s decision=%s", group, decided[0].value
                )
                service.groups.unfinished[group] = decided[0]
                finished += service.finish_group(group)[0]
        service.counters.redone_commits_total += finished
    if replayed:
        service._dirty = True
        service.snapshot()
    log.info(
        "event=transactions_recovered pending=%d committed_since_snapshot=%d group_members_finished=%d",
        len(service.pending), committed, finished,
    )  # fmt: skip


def _apply(service: TransactionService, op: Op, stored: StoredMessage) -> None:
    entry = service.pending.get(op.half_offset)
    kind = op.kind
    if kind in (OpKind.COMMIT, OpKind.ROLLBACK):
        state = TxnState.COMMITTED if kind is OpKind.COMMIT else TxnState.ROLLED_BACK
        if entry is not None:
            service._remove_pending(entry)
        service.remember(op.half_offset, state, 0)
    elif kind in (OpKind.GROUP_COMMIT, OpKind.GROUP_ROLLBACK) and op.group is not None:
        state = TxnState.COMMITTED if kind is OpKind.GROUP_COMMIT else TxnState.ROLLED_BACK
        service.groups.remember(op.group, state, 0)
        if state is TxnState.ROLLED_BACK:  # a group rollback writes nothing per member
            for half_offset in list(service.groups.members.get(op.group, ())):
                service._remove_pending(service.pending[half_offset])
                service.remember(half_offset, state, 0)
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
