"""Transaction groups: many half messages decided as one (docs/transactions.md).

A group's decision is one op record, the group's commit point; the members'
real messages (or rollback records) follow in batches of ``group_batch_size``,
and a crash between the two is finished by recovery and the next snapshot tick.
A group older than its timeout is rolled back by the broker. Every step holds
:attr:`TransactionLedger.lock <halfmoon.broker.transactions.ledger.TransactionLedger.lock>`.
"""

from __future__ import annotations

import bisect
import logging

from halfmoon.broker.message import PROPERTY_TRANSACTION_GROUP, OutgoingMessage
from halfmoon.broker.transaction_state import TxnEvent, TxnState, next_state
from halfmoon.broker.transactions.errors import TransactionGroupEnded
from halfmoon.broker.transactions.groups import check_group_id
from halfmoon.broker.transactions.ledger import LATENCY_BUCKETS_MS, TransactionLedger
from halfmoon.broker.transactions.oplog import Op, OpKind, op_message
from halfmoon.broker.transactions.records import PendingTxn, make_half, real_from_half
from halfmoon.broker.transactions.recovery import stored_group_decision
from halfmoon.broker.transactions.resolutions import DecisionSource, Resolution
from halfmoon.errors import InvalidArgument
from halfmoon.store.message import PROPERTY_UNIQUE_ID, Message

log = logging.getLogger("halfmoon.broker.transactions.service")


class GroupDecisions:
    """Transaction groups over the ledger: their members, decisions and timeouts."""

    def __init__(self, ledger: TransactionLedger) -> None:
        self.ledger = ledger

    def end_group(
        self,
        group: str,
        resolution: Resolution,
        source: DecisionSource = DecisionSource.CLIENT,
        *,
        body: bytes = b"",
    ) -> tuple[int, int]:
        """Decide every member of ``group`` at once; returns (members decided now, end offset).

        The group's op record is the commit point (``body``: the group's consume
        actions, :mod:`consume`); the members' real messages follow in batches of
        ``group_batch_size``. Repeating the decision is a no-op (0 members), the
        opposite one is TransactionAlreadyEnded.
        """
        check_group_id(group)
        event = Resolution.of(resolution).event
        source = DecisionSource.of(source)
        if event is TxnEvent.UNKNOWN:
            return 0, 0
        label = f"hm-group:{group}"
        with self.ledger.lock:
            decided = self.decided(group)
            if decided is not None:
                state, end_offset = decided
                next_state(state, event, transaction_id=label)
                if group in self.ledger.groups.unfinished:
                    count, end_offset = self.finish_group(group)
                    return count, end_offset
                return 0, end_offset
            state = next_state(TxnState.PREPARED, event, transaction_id=label)
            kind = OpKind.GROUP_COMMIT if state is TxnState.COMMITTED else OpKind.GROUP_ROLLBACK
            decision = op_message(Op(kind, group=group, source=source), body)
            return self.finish_group(group, (state, decision))

    def finish_group(
        self, group: str, decision: tuple[TxnState, Message] | None = None
    ) -> tuple[int, int]:
        """Complete the members of a decided group still pending. Locked.

        Per member only what is its own: its real message (one store append per
        ``group_batch_size``), leaving the pending set and the decided cache, a trace event.
        The group's bookkeeping (its member set, counters, latency) is done once per batch.

        ``decision``: the group is being decided now, by this op record. It is written in
        the same store append as the first batch of real messages, ahead of them (the
        commit point still comes first in the log, and a refused append leaves nothing
        decided), which saves a transaction of a few messages an append of its own.
        """
        groups = self.ledger.groups
        state = decision[0] if decision is not None else groups.unfinished[group]
        lead = [decision[1]] if decision is not None else []
        members = sorted(groups.members.get(group, ()))
        size = self.ledger.config.group_batch_size
        end_offset = decided_end = 0
        committed = state is TxnState.COMMITTED
        for start in range(0, max(len(members), 1), size):
            entries = [self.ledger.pending[h] for h in members[start : start + size]]
            reals = (
                [
                    real_from_half(self.ledger.half_of(e), e.half_offset, e.transaction_id)
                    for e in entries
                ]
                if committed
                else []
            )
            if lead or reals:
                results = self.ledger.write(lead + reals)
                if lead:  # the decision is stored: the group is decided from here on
                    decided_end = results[0].end_offset
                    groups.remember(group, state, decided_end)
                    groups.unfinished[group] = state
                    lead = []
                if reals:
                    end_offset = results[-1].end_offset
            if entries:
                self._settle_members(group, entries, state, end_offset)
        del groups.unfinished[group]
        return len(members), max(end_offset, decided_end)

    def _settle_members(
        self, group: str, entries: list[PendingTxn], state: TxnState, end_offset: int
    ) -> None:
        """:meth:`_settle` for a batch of one group's members (their records are appended)."""
        pending, decided, now = self.ledger.pending, self.ledger.decided, self.ledger.clock.now_ms()
        latency = self.ledger.latency
        for entry in entries:
            del pending[entry.half_offset]
            self.ledger.drop_record(entry)
            self.ledger.due.discard(entry)  # members are not checked: a no-op unless indexed
            decided[entry.half_offset] = (state, end_offset)
            latency[bisect.bisect_left(LATENCY_BUCKETS_MS, now - entry.stored_ms)] += 1
            self.ledger.traced(entry, state.value, source="group", group=group)
        self.ledger.groups.remove_members(group, [e.half_offset for e in entries])
        while len(decided) > self.ledger.config.decided_cache_entries:
            decided.popitem(last=False)
        if state is TxnState.COMMITTED:
            self.ledger.counters.committed_total += len(entries)
        else:
            self.ledger.counters.rolled_back_total += len(entries)

    def undecided_groups(self, min_age_ms: int) -> list[str]:
        """Groups with a pending member stored at least ``min_age_ms`` ago, by name."""
        now = self.ledger.clock.now_ms()
        with self.ledger.lock:
            return sorted(
                group
                for group, members in self.ledger.groups.members.items()
                if group not in self.ledger.groups.unfinished
                and any(now - self.ledger.pending[h].stored_ms >= min_age_ms for h in members)
            )

    def check_group_timeout(self, msg: OutgoingMessage) -> None:
        timeout = msg.transaction_timeout_ms
        if msg.transaction_group is None:
            raise InvalidArgument(
                "a transaction timeout applies to transaction group members only: "
                "set the transaction group too, or leave the timeout out"
            )
        if timeout is None or not 0 < timeout <= self.ledger.config.group_timeout_max_ms:
            raise InvalidArgument(
                f"transaction timeout {timeout} ms is out of range: use 1 to "
                f"{self.ledger.config.group_timeout_max_ms} ms (transaction.group_timeout_max_ms)",
                code="ILLEGAL_TRANSACTION_TIMEOUT",
            )

    def expired_groups(self, now_ms: int) -> list[str]:
        """Undecided groups whose deadline (first member's store time + the group's timeout)
        has passed: the broker rolls them back (docs/transactions.md, "Transaction timeout")."""
        with self.ledger.lock:
            return self.ledger.groups.expired(now_ms)

    def group_decision(self, group: str) -> TxnState | None:
        """The decision recorded here on ``group``; None while it has none."""
        check_group_id(group)
        with self.ledger.lock:
            return self.state(group)

    def group_pending(self, group: str) -> bool:
        """True when ``group`` has pending members and no decision: another member's send needs
        no key-index lookup (the server then runs it on its event loop)."""
        return group in self.ledger.groups.members and group not in self.ledger.groups.unfinished

    def append_member(self, group: str, record: Message) -> str:
        """Store ``record`` (routed to its real topic and queue) as a half message of ``group``;
        its transaction id. For copies the broker makes itself (a transactional reject's
        dead-letter copy): the producer's checks do not apply to group members."""
        check_group_id(group)
        topic, queue_id = record.topic, record.queue_id
        message_id = record.properties.get(PROPERTY_UNIQUE_ID, "")
        record.properties[PROPERTY_TRANSACTION_GROUP] = group
        half = make_half(record, topic, queue_id, None)
        with self.ledger.lock:
            decided = self.state(group)
            if decided is not None:
                raise TransactionGroupEnded(
                    f"transaction group {group!r} is already {decided.value.replace('_', ' ')}"
                )
            (result,) = self.ledger.write([half])
            now = self.ledger.clock.now_ms()
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
                due_ms=now + self.ledger.config.timeout_ms,
                deadline_ms=now + self.ledger.config.group_timeout_ms,
            )
            self.ledger.add_pending(entry)
            self.ledger.half_next = max(self.ledger.half_next, result.queue_offset + 1)
            return entry.transaction_id

    def state(self, group: str) -> TxnState | None:
        if group in self.ledger.groups.members and group not in self.ledger.groups.unfinished:
            return None  # has pending members and no decision yet
        decided = self.decided(group)
        return decided[0] if decided is not None else None

    def decided(self, group: str) -> tuple[TxnState, int] | None:
        hit = self.ledger.groups.decided(group)
        if hit is not None:
            return hit
        state = stored_group_decision(self.ledger.store, group)
        if state is None:
            return None
        self.ledger.groups.remember(group, state, 0)
        return state, 0
