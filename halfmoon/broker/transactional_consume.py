"""Transactional consumption: acks, rejects and offset commits decided with a transaction group.

A consumer registers what it did with a received message (ack, reject to
redeliver later, reject to the dead-letter topic) or where a pull consumer
stands in a queue, naming a transaction group; the group's commit applies
all of it together with the group's half messages, its rollback applies
none (docs/transactions.md, "Transactional consumption").

Register (:meth:`TransactionalConsume.ack` and friends): the handle is
checked at once (forged, garbled, another group's, or no longer in flight:
``INVALID_RECEIPT_HANDLE`` at the call, not at commit), the queue of an
offset commit must exist, and the group must not be decided yet. A
dead-letter reject stores the dead-letter copy now, as a half message of the
group. The action is kept in memory (:class:`ConsumeLedger`).

Commit (:meth:`TransactionalConsume.end`), under one lock so consume commits
are serialized:

1. take the group's actions; if the client says it registered another number
   (the broker restarted meanwhile and forgot some), roll the group back and
   fail with ``TRANSACTION_INCOMPLETE``;
2. lock every (consumer group, topic) the actions touch, in sorted order, and
   the offset table: no receive can redeliver, and no one can commit, what
   the actions name until step 5 is done;
3. fence: each delivery must still be in flight with the epoch of its handle
   (not acked another way, not redelivered to another consumer), each
   offset commit must find the offset it read from. Any failure: unlock,
   roll the whole group back, fail with ``TRANSACTION_FENCED``;
4. decide the group: one ``group_commit`` op record, the commit point, whose
   body holds the actions, then the members' real messages (the transaction
   service);
5. apply the actions in memory (complete, hide with the reject's delay, set
   the offset), unlock.

The caller acknowledges once the records are durable. Consumption state
(``consumption.json``) and offsets (``offsets.json``) are written only after
the store is durable up to the last applied commit, so a state file never
holds an ack whose commit record a crash could lose.

Recovery (:meth:`TransactionalConsume.recover`, when the broker opens): the
consumption state and offsets come from their files, which may predate the
last commits. ``consumed_commits.json`` holds the op-queue offset below
which every commit's actions were in the files written with it; the op
queue is replayed from there and each ``group_commit`` body is applied again
(idempotently: an ack of a message already done is a no-op, one above the
queue's cursor marks it done ahead so it is never delivered). A commit record
whose real messages a crash cut off is finished by the transaction service's
own recovery.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from halfmoon.broker.config import read_json, write_json_atomic
from halfmoon.broker.message import MessageType
from halfmoon.broker.offsets import OffsetTable
from halfmoon.broker.pop import PopService
from halfmoon.broker.receipt import ReceiptHandle
from halfmoon.broker.topics import TopicConfig
from halfmoon.broker.transaction_state import TransactionAlreadyEnded, TxnState
from halfmoon.broker.transactions.consume import (
    ActionKind,
    ConsumeAction,
    ConsumeLedger,
    TransactionFenced,
    TransactionIncomplete,
    TransactionRolledBack,
    decode_actions,
    encode_actions,
)
from halfmoon.broker.transactions.errors import TransactionGroupEnded, TransactionStateError
from halfmoon.broker.transactions.groups import check_group_id
from halfmoon.broker.transactions.oplog import OP_TOPIC, QUEUE_ID, OpKind, parse_op
from halfmoon.broker.transactions.recovery import read_queue
from halfmoon.broker.transactions.resolutions import DecisionSource, Resolution
from halfmoon.broker.transactions.service import TransactionService
from halfmoon.errors import InvalidArgument
from halfmoon.store.api import Store
from halfmoon.store.message import Message, StoredMessage

log = logging.getLogger(__name__)

MARKER_FILE = "consumed_commits.json"
SWEPT_MEMORY = 65_536  # swept groups remembered, to fence their late commits

# (consumer group, stored message, attempts) -> the dead-letter copy, routed
DeadLetterCopy = Callable[[str, StoredMessage, int], Message]


@dataclass(frozen=True)
class ConsumeEnd:
    members: int  # half messages decided by this call
    end_offset: int  # wait for store durability up to here before answering
    topics: frozenset[str]  # consumed topics whose deliveries changed (wake their waiters)


class TransactionalConsume:
    def __init__(
        self,
        store: Store,
        pop: PopService,
        offsets: OffsetTable,
        transactions: TransactionService,
        metadata_dir: Path | None,
        *,
        dead_letter_copy: DeadLetterCopy,
        retry_delay_ms: Callable[[str, int], int],
        check_queue: Callable[[str, str, int, int], None],
        check_consumable: Callable[[str, str], TopicConfig],
    ) -> None:
        self._store = store
        self._pop = pop
        self._offsets = offsets
        self._transactions = transactions
        self._marker = metadata_dir / MARKER_FILE if metadata_dir is not None else None
        self._dead_letter_copy = dead_letter_copy
        self._retry_delay_ms = retry_delay_ms
        self._check_queue = check_queue  # (group, topic, queue_id, offset): raises if illegal
        self._check_consumable = check_consumable  # (group, topic): the topic, or raises
        self.ledger = ConsumeLedger()
        self._commit_lock = threading.Lock()
        self._applied_end = 0  # commit-log end of the last commit applied in memory
        self.fenced_total = 0
        self.incomplete_total = 0
        self.replayed_total = 0
        self.swept_total = 0
        self.timed_out_total = 0
        # Undecided group -> when its first consume action was registered (memory, as the
        # actions are): a group without members times out from there.
        self._started_ms: dict[str, int] = {}
        # Groups the sweep rolled back (most recent last, bounded): their commit is fenced.
        self._swept: OrderedDict[str, None] = OrderedDict()

    # -- registering ---------------------------------------------------------------
    def ack(self, transaction_group: str, group: str, topic: str, handle: str) -> None:
        receipt, _ = self._delivery(transaction_group, group, topic, handle)
        self.ledger.add(
            transaction_group,
            ConsumeAction(
                ActionKind.ACK, group, topic, receipt.queue_id, receipt.queue_offset, receipt.epoch
            ),
        )

    def reject(
        self,
        transaction_group: str,
        group: str,
        topic: str,
        handle: str,
        delay_ms: int | None,
        dead_letter: bool,
    ) -> None:
        if dead_letter:
            self.dead_letter(transaction_group, group, topic, handle)
        else:
            self.nack(transaction_group, group, topic, handle, delay_ms)

    def nack(
        self, transaction_group: str, group: str, topic: str, handle: str, delay_ms: int | None
    ) -> None:
        """Reject to redeliver ``delay_ms`` after the commit (None: the group's retry backoff)."""
        receipt, attempt = self._delivery(transaction_group, group, topic, handle)
        if delay_ms is None:
            delay_ms = self._retry_delay_ms(group, attempt)
        if delay_ms < 0:
            raise InvalidArgument(f"a reject's delay must be >= 0 ms, got {delay_ms}")
        self.ledger.add(
            transaction_group,
            ConsumeAction(
                ActionKind.NACK,
                group,
                topic,
                receipt.queue_id,
                receipt.queue_offset,
                receipt.epoch,
                delay_ms=delay_ms,
            ),
        )

    def dead_letter(self, transaction_group: str, group: str, topic: str, handle: str) -> None:
        """Reject to the dead-letter topic: its copy is a half message of the group."""
        receipt, attempt = self._delivery(transaction_group, group, topic, handle)
        action = ConsumeAction(
            ActionKind.DEAD_LETTER,
            group,
            topic,
            receipt.queue_id,
            receipt.queue_offset,
            receipt.epoch,
        )
        self.ledger.add(transaction_group, action)
        stored = self._pop.read(topic, receipt.queue_id, receipt.queue_offset)
        if stored is None:
            return  # retention removed it: the commit only completes the delivery
        try:
            self._transactions.append_member(
                transaction_group, self._dead_letter_copy(group, stored, attempt)
            )
        except BaseException:
            self.ledger.take_one(transaction_group, action)
            raise

    def commit_offset(
        self,
        transaction_group: str,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        expected: int,
    ) -> None:
        """Move ``group``'s committed offset of the queue to ``offset`` on commit, if it is still
        ``expected`` then (-1: no offset committed)."""
        self._open_group(transaction_group)
        self._check_queue(group, topic, queue_id, offset)
        if expected < -1:
            raise InvalidArgument(f"expected offset must be >= -1, got {expected}")
        self.ledger.add(
            transaction_group,
            ConsumeAction(ActionKind.OFFSET, group, topic, queue_id, offset, expected=expected),
        )

    def _delivery(
        self, transaction_group: str, group: str, topic: str, handle: str
    ) -> tuple[ReceiptHandle, int]:
        if self._check_consumable(group, topic).message_type is MessageType.LITE:
            raise InvalidArgument(
                f"{topic!r} is a lite topic: its acks cannot join a transaction (ack it plainly)"
            )
        self._open_group(transaction_group)
        return self._pop.delivery(group, topic, handle)

    def _open_group(self, transaction_group: str) -> None:
        check_group_id(transaction_group)
        decided = self._transactions.group_decision(transaction_group)
        if decided is not None:
            raise TransactionGroupEnded(
                f"transaction group {transaction_group!r} is already "
                f"{decided.value.replace('_', ' ')}: use a new group id for a new transaction"
            )
        if transaction_group not in self._started_ms:
            self._started_ms[transaction_group] = self._transactions.clock.now_ms()

    # -- deciding ------------------------------------------------------------------
    def holds_actions(self, transaction_group: str) -> bool:
        return self.ledger.count(transaction_group) > 0

    def end(
        self,
        transaction_group: str,
        resolution: Resolution,
        source: DecisionSource = DecisionSource.CLIENT,
        expected_actions: int | None = None,
    ) -> ConsumeEnd:
        """Decide the group with its consume actions (see the module docs)."""
        check_group_id(transaction_group)
        resolution, source = Resolution.of(resolution), DecisionSource.of(source)
        if resolution is not Resolution.UNKNOWN:
            self._started_ms.pop(transaction_group, None)
        if resolution is Resolution.COMMIT:
            decided = self._transactions.group_decision(transaction_group)
            if decided is TxnState.COMMITTED:  # a retried commit: the answer it missed
                members, end = self._transactions.end_group(
                    transaction_group, Resolution.COMMIT, source
                )
                return ConsumeEnd(members, end, frozenset())
            if decided is TxnState.ROLLED_BACK and transaction_group not in self._swept:
                raise TransactionRolledBack(
                    f"TRANSACTION_ROLLED_BACK: transaction group {transaction_group!r} was "
                    "rolled back (by a rollback, an operator or the broker's transaction "
                    "timeout): nothing of it was applied; consume again in a new transaction"
                )
        elif (
            resolution is Resolution.ROLLBACK
            and self._transactions.group_decision(transaction_group) is TxnState.COMMITTED
        ):
            raise TransactionAlreadyEnded(
                f"TRANSACTION_ALREADY_ENDED: transaction group {transaction_group!r} is "
                "already committed; it cannot be rolled back"
            )
        if expected_actions is None and not self.holds_actions(transaction_group):
            members, end = self._transactions.end_group(transaction_group, resolution, source)
            return ConsumeEnd(members, end, frozenset())
        if resolution is not Resolution.COMMIT:
            members, end = self._transactions.end_group(transaction_group, resolution, source)
            if resolution is Resolution.ROLLBACK:  # UNKNOWN decides nothing: keep the actions
                self.ledger.take(transaction_group)
            return ConsumeEnd(members, end, frozenset())
        with self._commit_lock:
            if transaction_group in self._swept:
                raise TransactionFenced(
                    f"TRANSACTION_FENCED: transaction group {transaction_group!r} was rolled "
                    "back: a message it received went to another consumer before the commit"
                )
            actions = self.ledger.take(transaction_group)
            if expected_actions is not None and expected_actions != len(actions):
                self.incomplete_total += 1
                self._roll_back(transaction_group, source)
                raise TransactionIncomplete(
                    f"TRANSACTION_INCOMPLETE: transaction group {transaction_group!r}: the client "
                    "registered "
                    f"{expected_actions} acks, rejects and offset commits, the broker holds "
                    f"{len(actions)} (it restarted meanwhile); the group was rolled back: "
                    "its received messages come back, consume them in a new transaction"
                )
            if not actions:
                members, end = self._transactions.end_group(
                    transaction_group, Resolution.COMMIT, source
                )
                return ConsumeEnd(members, end, frozenset())
            with self._locked(actions):
                stale = self._first_stale(actions)
                if stale is not None:
                    self.fenced_total += 1
                    fenced = TransactionFenced(
                        f"TRANSACTION_FENCED: transaction group {transaction_group!r} was "
                        f"rolled back: {stale}"
                    )
                else:
                    try:
                        members, end = self._transactions.end_group(
                            transaction_group,
                            Resolution.COMMIT,
                            source,
                            body=encode_actions(actions),
                        )
                    except BaseException:
                        if self._transactions.group_decision(transaction_group) is None:
                            self.ledger.put_back(transaction_group, actions)  # nothing written
                        raise
                    self._apply(actions, live=True)
                    self._applied_end = max(self._applied_end, end)
                    return ConsumeEnd(members, end, frozenset(a.topic for a in actions))
        self._roll_back(transaction_group, source)
        raise fenced

    def sweep(self) -> int:
        """Roll back the undecided groups that can never commit; how many.

        A group is doomed once the delivery of a message it acks or rejects is
        over: its consumer died or stalled mid-transaction and the message went
        to another (epochs never come back). Rolling it back drops its half
        messages and registered actions now instead of keeping them until an
        operator decides; its late commit is fenced. The broker's tick calls
        this every ``broker.offset_persist_interval_ms``.
        """
        doomed = [
            group
            for group, actions in self.ledger.items()
            # Read without the state locks: a delivery that is over stays over.
            if any(
                a.kind is not ActionKind.OFFSET
                and not self._pop.holds(a.group, a.topic, a.queue_id, a.offset, a.epoch)
                for a in actions
            )
        ]
        for group in doomed:
            with self._commit_lock:
                if not self.ledger.take(group):
                    continue  # decided meanwhile
                self._started_ms.pop(group, None)
                self._swept[group] = None
                while len(self._swept) > SWEPT_MEMORY:
                    self._swept.popitem(last=False)
                try:
                    self._transactions.end_group(group, Resolution.ROLLBACK, DecisionSource.CHECK)
                except TransactionStateError:
                    continue  # committed meanwhile by an operator
                self.swept_total += 1
                log.info("event=transaction_group_swept group=%s", group)
        return len(doomed)

    # -- the transaction timeout -------------------------------------------------------
    def expired_groups(self, now_ms: int) -> list[str]:
        """Undecided groups past their transaction timeout: those with members whose deadline
        passed (first member's store time + the group's timeout, durable: a restart keeps
        it), and member-less ones whose first consume action is older than the default."""
        expired = set(self._transactions.expired_groups(now_ms))
        cutoff = now_ms - self._transactions.config.group_timeout_ms
        for group, started in list(self._started_ms.items()):
            if started > cutoff or group in expired:
                continue
            if self._transactions.group_pending(group):
                continue  # its members' deadline governs (their producer's timeout)
            if self.ledger.count(group):
                expired.add(group)
            else:
                self._started_ms.pop(group, None)  # nothing registered after all
        return sorted(expired)

    def expire(self, now_ms: int) -> int:
        """Roll back every group past its transaction timeout here; how many.

        A worker that died (or stalled) between its first send and its commit, or whose
        broker restarted and lost its acks, leaves a group nobody decides: past the
        timeout its half messages are discarded and its registered actions dropped (the
        received messages come back after their invisible time); a late commit answers
        ``TRANSACTION_ROLLED_BACK``. In cluster mode the group's coordinator decides
        instead (``cluster/internal/txn_groups.py``). The broker's tick calls this every
        ``transaction.group_timeout_scan_ms``."""
        rolled = 0
        for group in self.expired_groups(now_ms):
            with self._commit_lock:
                self._started_ms.pop(group, None)
                actions = self.ledger.take(group)
                try:
                    members, _ = self._transactions.end_group(
                        group, Resolution.ROLLBACK, DecisionSource.CHECK
                    )
                except TransactionStateError:
                    continue  # decided meanwhile
            rolled += 1
            self.timed_out_total += 1
            log.info(
                "event=transaction_group_timed_out group=%s members=%d actions=%d",
                group,
                members,
                len(actions),
            )
        return rolled

    def _roll_back(self, transaction_group: str, source: DecisionSource) -> None:
        self._transactions.end_group(transaction_group, Resolution.ROLLBACK, source)

    @contextmanager
    def _locked(self, actions: list[ConsumeAction]) -> Iterator[None]:
        consumed = sorted({(a.group, a.topic) for a in actions if a.kind is not ActionKind.OFFSET})
        with ExitStack() as stack:
            stack.enter_context(self._pop.locked(consumed))
            if any(a.kind is ActionKind.OFFSET for a in actions):
                stack.enter_context(self._offsets.held())
            yield

    def _first_stale(self, actions: list[ConsumeAction]) -> str | None:
        """Why the first action that no longer holds fails; None when all hold. Locked."""
        for a in actions:
            if a.kind is ActionKind.OFFSET:
                current = self._offsets.get(a.group, a.topic, a.queue_id)
                if (-1 if current is None else current) != a.expected:
                    return (
                        f"group {a.group!r} read {a.topic!r} queue {a.queue_id} from offset "
                        f"{a.expected}, but its committed offset is now {current} (the queue "
                        "was committed by another consumer since): read again from there"
                    )
            elif not self._pop.holds(a.group, a.topic, a.queue_id, a.offset, a.epoch):
                return (
                    f"the delivery of {a.topic!r} queue {a.queue_id} offset {a.offset} to "
                    f"group {a.group!r} is over (acked another way, or its invisible time ended "
                    "and it went to another consumer): nothing of the transaction was applied"
                )
        return None

    def _apply(self, actions: list[ConsumeAction], *, live: bool) -> None:
        """Apply committed actions in memory; locked when ``live``, idempotent when not."""
        for a in actions:
            if a.kind is ActionKind.OFFSET:
                if live:
                    self._offsets.set_held(a.group, a.topic, a.queue_id, a.offset)
                else:
                    self._offsets.set(a.group, a.topic, a.queue_id, a.offset)
            elif a.kind is ActionKind.NACK:
                self._pop.hide_delivery(
                    a.group, a.topic, a.queue_id, a.offset, a.delay_ms, locked=live
                )
            elif live:
                self._pop.complete_delivery(a.group, a.topic, a.queue_id, a.offset)
            else:
                self._pop.replay_done(a.group, a.topic, a.queue_id, a.offset)

    # -- state files and recovery ----------------------------------------------------
    def persist(self, write_state: Callable[[], None]) -> None:
        """Run ``write_state`` (which writes consumption state and offsets), then the marker.

        The marker is the op-queue offset below which every commit is applied in
        memory (read under the commit lock, before the state is captured); the
        state files are written only once the store is durable past those commits.
        """
        with self._commit_lock:
            marker = self._store.max_offset(OP_TOPIC, QUEUE_ID)
            applied_end = self._applied_end
        if applied_end:
            self._store.wait_durable(applied_end)
        write_state()
        if self._marker is not None:
            write_json_atomic(self._marker, {"version": 1, "op_next": marker})

    def recover(self) -> int:
        """Apply again the commits the state files may not hold; returns how many."""
        data = read_json(self._marker) if self._marker is not None else None
        if isinstance(data, dict) and data.get("version") == 1:
            start = int(data["op_next"])
        else:
            start = self._store.min_offset(OP_TOPIC, QUEUE_ID)
        replayed = 0
        for stored in read_queue(self._store, OP_TOPIC, start):
            if not stored.body:
                continue
            op = parse_op(stored)
            if op is None or op.kind is not OpKind.GROUP_COMMIT:
                continue
            try:
                actions = decode_actions(stored.body)
            except ValueError as error:
                log.error(
                    "event=bad_consume_record offset=%d error=%s", stored.commit_log_offset, error
                )
                continue
            self._apply(actions, live=False)
            replayed += 1
        self.replayed_total = replayed
        if replayed:
            log.info("event=consume_commits_replayed commits=%d from_op_offset=%d", replayed, start)
        return replayed


__all__ = ["ConsumeEnd", "TransactionalConsume"]
