"""Transaction groups: many half messages, one decision.

Half messages that carry the same transaction group id (the reserved property
``__HM_TXN_GROUP``) are members of one group, whichever producer sent them to
whichever topic and queue. The group is decided once, by
``end_transaction_group``: a single ``group_commit`` / ``group_rollback`` op
record is the commit point, then the members are completed in batches. Rules
(see ``docs/transactions.md``):

- a member cannot be committed or rolled back on its own (UNKNOWN is a no-op);
  once the group is decided, ending a member follows the group's decision;
- members are not checked: the group's owner (or an operator) decides;
- a member that arrives after the group was decided is refused at send time,
  whatever the decision (a late copy from a retried task must not slip into a
  committed group, and a rolled-back group stays empty).

This module keeps the in-memory side: pending members per group, and a
bounded cache of recent group decisions (older ones are found through the op
topic's key index by the service).
"""

from __future__ import annotations

import re
from collections import OrderedDict

from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions.errors import IllegalTransactionGroup

MAX_GROUP_ID_LENGTH = 128

# No whitespace at all: ``\s`` is what ``str.isspace`` calls whitespace (checked on every
# member, commit and ack of a group, so matched in C rather than character by character).
_NO_SPACE = re.compile(r"\S+")


def check_group_id(group: str) -> str:
    if (
        not isinstance(group, str)
        or not 1 <= len(group) <= MAX_GROUP_ID_LENGTH
        or not group.isprintable()
        or _NO_SPACE.fullmatch(group) is None
    ):
        raise IllegalTransactionGroup(
            f"illegal transaction group id {group!r}: use 1 to {MAX_GROUP_ID_LENGTH} "
            "printable characters without spaces"
        )
    return group


class GroupBook:
    """Pending members per group and recent group decisions. Not thread-safe: the service locks."""

    def __init__(self, cache_size: int) -> None:
        self.members: dict[str, set[int]] = {}  # group -> half offsets of its pending members
        self._decided: OrderedDict[str, tuple[TxnState, int]] = OrderedDict()
        self._cache_size = cache_size
        # Decided groups whose members are not all completed yet (an append failed midway,
        # or recovery found a torn group commit): the service finishes them.
        self.unfinished: dict[str, TxnState] = {}
        # group -> when it is rolled back undecided: its earliest member's deadline
        self.deadlines: dict[str, int] = {}

    def add_member(self, group: str, half_offset: int, deadline_ms: int | None = None) -> None:
        self.members.setdefault(group, set()).add(half_offset)
        if deadline_ms is not None:
            known = self.deadlines.get(group)
            if known is None or deadline_ms < known:
                self.deadlines[group] = deadline_ms

    def expired(self, now_ms: int) -> list[str]:
        """Undecided groups with pending members whose deadline has passed, by name."""
        return sorted(
            group
            for group, deadline in self.deadlines.items()
            if deadline <= now_ms and group in self.members and group not in self.unfinished
        )

    def remove_member(self, group: str, half_offset: int) -> None:
        members = self.members.get(group)
        if members is not None:
            members.discard(half_offset)
            if not members:
                del self.members[group]
                self.deadlines.pop(group, None)

    def remove_members(self, group: str, half_offsets: list[int]) -> None:
        members = self.members.get(group)
        if members is not None:
            members.difference_update(half_offsets)
            if not members:
                del self.members[group]
                self.deadlines.pop(group, None)

    def decided(self, group: str) -> tuple[TxnState, int] | None:
        """(decision, end offset of its record) when recently decided; None if unknown here."""
        hit = self._decided.get(group)
        if hit is not None:
            self._decided.move_to_end(group)
        return hit

    def remember(self, group: str, state: TxnState, end_offset: int) -> None:
        self._decided[group] = (state, end_offset)
        self._decided.move_to_end(group)
        while len(self._decided) > self._cache_size:
            self._decided.popitem(last=False)
