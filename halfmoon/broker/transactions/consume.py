"""Consume actions: what a transaction group holds besides half messages.

A transaction group may hold, next to its half messages, what a consumer did
with the messages it received (docs/transactions.md, "Transactional
consumption"):

- ``ack``: the delivery named by a receipt handle is consumed;
- ``nack``: the delivery comes back after ``delay_ms`` (a reject to redeliver
  later), its attempt counted;
- ``dead_letter``: the delivery is consumed and its copy goes to the group's
  dead-letter topic (the copy is a half message of the same group, so it
  appears on commit only);
- ``offset``: a pull consumer's committed offset of one queue moves to
  ``offset``, provided it is still ``expected`` (the offset the consumer
  read from; -1: none was committed).

Each action is checked when the consumer registers it (a forged handle or an
unknown queue fails at the call) and kept in memory, per group, by
:class:`ConsumeLedger` until the group is decided. A commit writes them all
into the body of the group's single ``group_commit`` op record (the commit
point, see :mod:`oplog`), so recovery can apply them again after a crash.
"""

from __future__ import annotations

import enum
import json
import threading
from dataclasses import dataclass

from halfmoon.broker.transaction_state import TransactionAlreadyEnded
from halfmoon.errors import Conflict, InvalidArgument

# Actions one transaction group may hold: their record (JSON, ~80 bytes each) stays far
# below the store's message size limit.
MAX_ACTIONS_PER_GROUP = 10_000
BODY_VERSION = 1


class ConsumeActionConflict(InvalidArgument):
    """The same delivery or queue is already in the transaction with another action."""

    code = "TRANSACTION_CONSUME_CONFLICT"
    protocol_code = "BAD_REQUEST"


class TransactionFenced(Conflict):
    """A consume action of the group no longer holds: nothing of the group was applied.

    A receipt handle whose delivery was acked another way or went to another
    consumer (its invisible time ended and it was received again), or a
    pull consumer's offset commit whose queue was committed by someone else
    since it read from it. The broker rolls the whole group back.
    """

    code = "TRANSACTION_FENCED"
    protocol_code = "PRECONDITION_FAILED"


class TransactionIncomplete(Conflict):
    """The broker lost consume actions the client registered (it restarted meanwhile)."""

    code = "TRANSACTION_INCOMPLETE"
    protocol_code = "PRECONDITION_FAILED"


class TransactionRolledBack(TransactionAlreadyEnded):
    """A commit of a group already rolled back (by its owner, an operator or the broker's
    transaction timeout): nothing of it was applied. A retried commit learns it this way.
    (The protocol code stays BAD_REQUEST, as for any decision opposite to the one made.)"""

    code = "TRANSACTION_ROLLED_BACK"
    protocol_code = "BAD_REQUEST"


class ActionKind(enum.Enum):
    ACK = "ack"
    NACK = "nack"
    DEAD_LETTER = "dead_letter"
    OFFSET = "offset"


@dataclass(frozen=True, slots=True)
class ConsumeAction:
    kind: ActionKind
    group: str  # the consumer group
    topic: str
    queue_id: int
    offset: int  # the received message's queue offset; for OFFSET the new committed offset
    epoch: int = 0  # the delivery's epoch (ack, nack, dead letter)
    expected: int = -1  # OFFSET: the committed offset the consumer read from (-1: none)
    delay_ms: int = 0  # NACK: invisible time from the commit

    @property
    def target(self) -> tuple[str, str, int, int] | tuple[str, str, int]:
        """What the action changes: one delivery, or one queue's committed offset."""
        if self.kind is ActionKind.OFFSET:
            return (self.group, self.topic, self.queue_id)
        return (self.group, self.topic, self.queue_id, self.offset)


def encode_actions(actions: list[ConsumeAction]) -> bytes:
    """The body of a ``group_commit`` op record holding ``actions``."""
    rows = [
        [a.kind.value, a.group, a.topic, a.queue_id, a.offset, a.epoch, a.expected, a.delay_ms]
        for a in actions
    ]
    return json.dumps({"v": BODY_VERSION, "actions": rows}, separators=(",", ":")).encode()


def decode_actions(body: bytes) -> list[ConsumeAction]:
    """The actions a ``group_commit`` body holds ([] for an empty body); ValueError if garbled."""
    if not body:
        return []
    try:
        document = json.loads(body)
        if document.get("v") != BODY_VERSION:
            raise ValueError(f"unknown consume record version {document.get('v')!r}")
        return [
            ConsumeAction(
                ActionKind(kind),
                str(group),
                str(topic),
                int(queue_id),
                int(offset),
                int(epoch),
                int(expected),
                int(delay_ms),
            )
            for kind, group, topic, queue_id, offset, epoch, expected, delay_ms in document[
                "actions"
            ]
        ]
    except (TypeError, KeyError, AttributeError, json.JSONDecodeError) as error:
        raise ValueError(f"garbled consume record: {error}") from None


class ConsumeLedger:
    """Consume actions registered per undecided transaction group (memory only).

    A broker restart forgets them; the client says how many it registered
    when it commits, so a commit after a restart fails
    (:class:`TransactionIncomplete`) instead of committing the sends without
    their acks.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, dict[tuple[object, ...], ConsumeAction]] = {}

    def add(self, transaction_group: str, action: ConsumeAction) -> None:
        """Register ``action``; the same action again is a no-op, a different one on the same
        delivery or queue is :class:`ConsumeActionConflict`."""
        with self._lock:
            actions = self._groups.setdefault(transaction_group, {})
            held = actions.get(action.target)
            if held is not None:
                if held == action or (
                    held.kind is ActionKind.OFFSET
                    and action.kind is ActionKind.OFFSET
                    and held.expected == action.expected
                ):
                    actions[action.target] = action  # a later offset of the same read wins
                    return
                raise ConsumeActionConflict(
                    f"{action.topic!r} queue {action.queue_id} offset {action.offset} of group "
                    f"{action.group!r} is already in transaction group {transaction_group!r} "
                    f"as {held.kind.value}: one action per message (and per queue's offset)"
                )
            if len(actions) >= MAX_ACTIONS_PER_GROUP:
                raise InvalidArgument(
                    f"transaction group {transaction_group!r} holds {MAX_ACTIONS_PER_GROUP} "
                    "consume actions, the most one group may: commit and start another"
                )
            actions[action.target] = action

    def count(self, transaction_group: str) -> int:
        with self._lock:
            return len(self._groups.get(transaction_group, ()))

    def take(self, transaction_group: str) -> list[ConsumeAction]:
        """Remove and return the group's actions (in registration order)."""
        with self._lock:
            return list(self._groups.pop(transaction_group, {}).values())

    def take_one(self, transaction_group: str, action: ConsumeAction) -> None:
        """Forget one registered action (its registration failed halfway)."""
        with self._lock:
            actions = self._groups.get(transaction_group)
            if actions is not None and actions.get(action.target) == action:
                del actions[action.target]

    def put_back(self, transaction_group: str, actions: list[ConsumeAction]) -> None:
        """Restore actions taken for a commit that could not be written (the store failed)."""
        with self._lock:
            held = self._groups.setdefault(transaction_group, {})
            for action in actions:
                held.setdefault(action.target, action)

    def items(self) -> list[tuple[str, list[ConsumeAction]]]:
        """Every undecided group's actions (a copy)."""
        with self._lock:
            return [(group, list(actions.values())) for group, actions in self._groups.items()]

    def pending_groups(self) -> int:
        with self._lock:
            return len(self._groups)


__all__ = [
    "MAX_ACTIONS_PER_GROUP",
    "ActionKind",
    "ConsumeAction",
    "ConsumeActionConflict",
    "ConsumeLedger",
    "TransactionFenced",
    "TransactionIncomplete",
    "TransactionRolledBack",
    "decode_actions",
    "encode_actions",
]
