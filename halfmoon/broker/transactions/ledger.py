"""The transaction service's ledger: the pending set (one :class:`PendingTxn` per
undecided half message), the recent decisions, the appends that change them,
their snapshot on disk, and what an operator reads about them (listing, stats).

:class:`TransactionLedger` adopts the state :func:`recovery.recover` returns;
:class:`halfmoon.broker.transactions.service.TransactionService` holds one and
drives the transitions on it, each under :attr:`TransactionLedger.lock`.
"""

from __future__ import annotations

import builtins  # ``list`` is also a method of TransactionLedger
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from halfmoon.broker.clock import Clock
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions.config import TransactionConfig
from halfmoon.broker.transactions.due_index import DueIndex
from halfmoon.broker.transactions.groups import GroupBook
from halfmoon.broker.transactions.oplog import OP_TOPIC, Op, op_message
from halfmoon.broker.transactions.records import PendingTxn
from halfmoon.broker.transactions.recovery import Recovered
from halfmoon.errors import NotFound
from halfmoon.store.api import AppendResult, Store
from halfmoon.store.fsutil import replace_atomically
from halfmoon.store.message import Message, StoredMessage

# Half records are kept in memory (for a commit without a read) up to this many body bytes in all.
RECORD_CACHE_BYTES = 64 * 1024 * 1024
# A snapshot waits at least this many times as long as the last one took: with 100,000 pending it
# takes a few hundred ms on a loaded machine, and the tick thread must not spend its time there.
SNAPSHOT_COST_FACTOR = 50
# Most transactions one listing returns unless the caller asks for another bound.
LIST_LIMIT = 1000

# Time from half message to decision, in ms (upper bounds of the histogram buckets).
LATENCY_BUCKETS_MS = (10, 50, 100, 500, 1_000, 5_000, 10_000, 30_000, 60_000, 300_000, 3_600_000)


@dataclass(frozen=True)
class TransactionInfo:
    transaction_id: str
    topic: str
    queue_id: int
    message_id: str
    keys: list[str]
    producer_group: str | None
    transaction_group: str | None
    state: str  # "prepared" or "parked"
    checks_sent: int
    age_ms: int
    stored_ms: int
    # When the check service will next ask a producer (or park it, at the check limit), from
    # its schedule; None when no check is coming (parked, a transaction group's member).
    next_check_ms: int | None = None


@dataclass
class TransactionStats:
    pending: int = 0  # gauge: half messages without a decision (parked included)
    parked: int = 0  # gauge
    committed_total: int = 0
    rolled_back_total: int = 0
    checks_sent_total: int = 0
    checks_unsent_total: int = 0  # no live producer: not counted against check_max
    check_errors_total: int = 0
    parked_total: int = 0
    redone_commits_total: int = 0  # group members committed by recovery after a crash
    lost_total: int = 0  # half messages removed by retention before a decision
    decision_latency_ms: dict[str, int] = field(default_factory=dict)  # bucket "le" -> count
    checks_answered_total: int = 0  # EndTransaction answers with source "check"
    oldest_pending_age_ms: int = 0  # gauge: how long the oldest undecided one has waited


def _snapshot_json(half_next: int, op_next: int, entries: builtins.list[PendingTxn]) -> bytes:
    """The snapshot as compact JSON (what ``json.dumps(..., separators=(",", ":"))`` writes)::

        {"version":1,"half_next":N,"op_next":M,"pending":[[half offset,checks,parked 0/1],...]}

    Formatted entry by entry as text: a list per entry (100,000 of them) cost twice the time
    and fed the garbage collector, whose full collections then ran inside the snapshot.
    """
    parked = TxnState.PARKED
    pending = ",".join(
        [f"[{e.half_offset},{e.checks},{1 if e.state is parked else 0}]" for e in entries]
    )
    return (
        f'{{"version":1,"half_next":{half_next},"op_next":{op_next},"pending":[{pending}]}}'
    ).encode()


class TransactionLedger:
    SNAPSHOT_FILE = "transactions.json"

    def __init__(
        self,
        store: Store,
        path: Path | None,
        config: TransactionConfig,
        clock: Clock,
        recovered: Recovered,
    ) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self._path = path
        self.lock = threading.RLock()
        self._snapshot_lock = threading.Lock()
        self.pending: dict[int, PendingTxn] = recovered.pending
        self.decided: OrderedDict[int, tuple[TxnState, int]] = recovered.decided
        self.groups: GroupBook = recovered.groups
        self.op_buffer: list[Op] = []  # check counts, appended with the next batch
        # half queue offset up to which the pending set is complete
        self.half_next = recovered.half_next
        self.op_next = recovered.op_next  # op queue offset up to which ops are applied
        self._max_end = 0  # end offset of the last record this service appended
        self._cached_bytes = 0  # bodies held in PendingTxn.record
        # Entries holding a cached record, oldest first: the record is dropped once the entry
        # is ``timeout_ms`` old (an orphan, most likely; a commit reads the half then).
        self._young: deque[PendingTxn] = deque()
        # What may want a check, by when (see :mod:`due_index`); recovery forgot retry times.
        self.due = DueIndex()
        for entry in self.pending.values():
            self.index_for_checks(entry)
        self.dirty = False
        self.last_snapshot_ms = clock.now_ms()
        self.snapshot_cost_ms = 0.0  # how long the last snapshot took (real time)
        self.counters = TransactionStats()
        # Told the id of every EndTransaction (any source, any resolution): the check sender
        # clears the producer's outstanding check with it. Must be cheap and not raise.
        self.on_end: Callable[[str], None] | None = None
        self.latency = [0] * (len(LATENCY_BUCKETS_MS) + 1)
        # The message trace (halfmoon/broker/trace.py): (message id, topic, event, **fields).
        self.trace: Callable[..., None] | None = None

    def traced(self, entry: PendingTxn, event: str, **fields: object) -> None:
        """Record a step of ``entry``'s history in the message trace (keyed by message id)."""
        if self.trace is not None:
            self.trace(
                entry.message_id, entry.topic, event, transaction_id=entry.transaction_id, **fields
            )

    # -- listing ---------------------------------------------------------------------
    def list(
        self,
        *,
        topic: str | None = None,
        state: TxnState | None = None,
        limit: int = LIST_LIMIT,
        next_check: Callable[[PendingTxn], int | None] | None = None,
    ) -> builtins.list[TransactionInfo]:
        """Undecided transactions, oldest first (optionally of one topic / one state);
        ``next_check`` tells each one's next check time (the check service's schedule)."""
        now = self.clock.now_ms()
        with self.lock:
            chosen = [
                e
                for e in self.pending.values()
                if (topic is None or e.topic == topic) and (state is None or e.state is state)
            ]
        chosen.sort(key=lambda e: (e.stored_ms, e.half_offset))
        return [self.info(e, now, next_check) for e in chosen[: max(0, limit)]]

    @staticmethod
    def info(
        entry: PendingTxn,
        now_ms: int,
        next_check: Callable[[PendingTxn], int | None] | None = None,
    ) -> TransactionInfo:
        return TransactionInfo(
            transaction_id=entry.transaction_id,
            topic=entry.topic,
            queue_id=entry.queue_id,
            message_id=entry.message_id,
            keys=list(entry.keys),
            producer_group=entry.producer_group,
            transaction_group=entry.group,
            state=entry.state.value,
            checks_sent=entry.checks,
            age_ms=max(0, now_ms - entry.stored_ms),
            stored_ms=entry.stored_ms,
            next_check_ms=next_check(entry) if next_check is not None else None,
        )

    def stats(self) -> TransactionStats:
        with self.lock:
            c = self.counters
            parked = 0
            oldest: int | None = None
            for e in self.pending.values():
                if e.state is TxnState.PARKED:
                    parked += 1
                if oldest is None or e.stored_ms < oldest:
                    oldest = e.stored_ms
            labels = [str(b) for b in LATENCY_BUCKETS_MS] + ["+Inf"]
            return TransactionStats(
                pending=len(self.pending),
                parked=parked,
                committed_total=c.committed_total,
                rolled_back_total=c.rolled_back_total,
                checks_sent_total=c.checks_sent_total,
                checks_unsent_total=c.checks_unsent_total,
                check_errors_total=c.check_errors_total,
                parked_total=c.parked_total,
                redone_commits_total=c.redone_commits_total,
                lost_total=c.lost_total,
                decision_latency_ms=dict(zip(labels, self.latency, strict=True)),
                checks_answered_total=c.checks_answered_total,
                oldest_pending_age_ms=0 if oldest is None else max(0, self.clock.now_ms() - oldest),
            )

    def snapshot(self) -> None:
        """Write the pending set and the offsets it covers, once the store holds them durably.

        Only the list of entries is taken under the lock (a C-level copy): a
        tick must not hold up decisions for a walk over 100,000 of them. The
        entries' fields are read afterwards, so they may be newer than the
        offsets; that is harmless, since everything that changes them after
        the offsets (a check count, parking, resuming, a decision) is an op or
        a commit record that recovery replays or looks up anyway, each setting
        absolute values. Compact JSON, formatted as text (:func:`_snapshot_json`).
        """
        if self._path is None:
            return
        started = time.monotonic()
        with self._snapshot_lock:
            with self.lock:
                if self.op_buffer:
                    self.write([])
                if not self.dirty:
                    return
                half_next, op_next, end = self.half_next, self.op_next, self._max_end
                entries = builtins.list(self.pending.values())
                self.dirty = False
            data = _snapshot_json(half_next, op_next, entries)
            try:
                self.store.wait_durable(end)
                self._path.parent.mkdir(parents=True, exist_ok=True)
                replace_atomically(self._path, data)
            except BaseException:
                self.dirty = True
                raise
            self.snapshot_cost_ms = (time.monotonic() - started) * 1000

    def close(self) -> None:
        self.snapshot()

    # -- internals -------------------------------------------------------------------
    def half_of(self, entry: PendingTxn) -> Message | StoredMessage:
        return (
            entry.record
            if entry.record is not None
            else self.read_half(entry.half_offset, entry.half_end)
        )

    def read_half(self, half_offset: int, half_end: int) -> StoredMessage:
        """The half record; waits for it when it is written but not yet readable (sync flush)."""
        try:
            return self.store.read_at(half_offset)
        except NotFound:
            self.store.wait_durable(half_end, timeout=30.0)
            return self.store.read_at(half_offset)

    def write(self, batch: builtins.list[Message]) -> builtins.list[AppendResult]:
        """Append buffered ops then ``batch`` in one store call; results for ``batch``. Locked."""
        buffered = [op_message(op) for op in self.op_buffer]
        results = self.store.append(buffered + batch)
        self.op_buffer.clear()
        for result in results:
            if result.topic == OP_TOPIC:
                self.op_next = max(self.op_next, result.queue_offset + 1)
        if results:
            self._max_end = max(self._max_end, results[-1].end_offset)
        self.dirty = True
        return results[len(buffered) :]

    def keep_record(self, entry: PendingTxn, record: Message | StoredMessage) -> None:
        """Hold ``record`` as the entry's half record while the cache has room. Locked."""
        self.drop_record(entry)
        if self._cached_bytes < RECORD_CACHE_BYTES:
            entry.record = record
            self._cached_bytes += len(record.body)

    def drop_record(self, entry: PendingTxn) -> None:
        """Forget the cached half record (decided, or old enough to be checked: read it then)."""
        if entry.record is not None:
            self._cached_bytes -= len(entry.record.body)
            entry.record = None

    def drop_old_records(self, now_ms: int) -> int:
        """Drop the cached records of entries ``timeout_ms`` old or more; how many were looked
        at (each entry once: the cost follows what expires)."""
        cutoff = now_ms - self.config.timeout_ms
        young = self._young
        looked = 0
        with self.lock:
            while young and young[0].stored_ms <= cutoff:
                self.drop_record(young.popleft())
                looked += 1
        return looked

    def add_pending(self, entry: PendingTxn) -> None:
        self.pending[entry.half_offset] = entry
        if entry.group is not None:
            self.groups.add_member(entry.group, entry.half_offset, entry.deadline_ms)
        if entry.record is not None:
            self._young.append(entry)
        self.index_for_checks(entry)

    def remove_pending(self, entry: PendingTxn) -> None:
        self.pending.pop(entry.half_offset, None)
        self.drop_record(entry)
        self.due.discard(entry)
        if entry.group is not None:
            self.groups.remove_member(entry.group, entry.half_offset)

    def index_for_checks(self, entry: PendingTxn) -> None:
        """Index a PREPARED transaction outside any group at the time it next wants a check
        (group members are decided by their group; parked ones wait for an operator)."""
        if entry.group is None and entry.state is TxnState.PREPARED:
            self.due.add(entry, self.check_due_ms(entry))

    def check_due_ms(self, entry: PendingTxn) -> int:
        """When ``entry`` next wants a check: its first check time, and ``retry_ms`` after its
        last counted check."""
        if entry.last_check_ms is None:
            return entry.due_ms
        return max(entry.due_ms, entry.last_check_ms + self.config.retry_ms)
