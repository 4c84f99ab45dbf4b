"""The lifecycle of a transactional message, as one transition table.

A half message starts PREPARED. The producer's EndTransaction, the check
service and an operator move it on; nothing else may. Every legal move is a
row of ``_TRANSITIONS``; anything else raises a typed error, so a second
EndTransaction, a late check answer or an operator's command can never push a
transaction into a state the table does not allow::

                 check sent / UNKNOWN
                    ┌──────┐
                    ▼      │
    ──send──▶  PREPARED ───┘ ──COMMIT──▶ COMMITTED   (COMMIT again: no-op)
                 │  ▲  │
        check max│  │resume  ──ROLLBACK──▶ ROLLED_BACK (ROLLBACK again: no-op)
                 ▼  │
                PARKED ──COMMIT / ROLLBACK (operator)──▶ COMMITTED / ROLLED_BACK

Ending a decided transaction the opposite way is :class:`TransactionAlreadyEnded`;
UNKNOWN and check answers for a decided transaction change nothing (the
decision stands, so the check service never asks again). No I/O here: the
transaction service persists each decision before it acknowledges it.
"""

from __future__ import annotations

import enum

from halfmoon.errors import Conflict


class TxnState(enum.Enum):
    PREPARED = "prepared"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"
    PARKED = "parked"  # checked transaction.check_max times without an answer

    @property
    def decided(self) -> bool:
        return self in (TxnState.COMMITTED, TxnState.ROLLED_BACK)


class TxnEvent(enum.Enum):
    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"  # the producer does not know yet: leave it to the checks
    CHECK_SENT = "check_sent"  # the check service asked a live producer
    PARK = "park"  # the check limit was reached
    RESUME = "resume"  # an operator puts a parked transaction back under checks


class TransactionStateError(Conflict):
    """A move the transition table does not allow."""

    code = "ILLEGAL_TRANSACTION_TRANSITION"
    protocol_code = "BAD_REQUEST"


class TransactionAlreadyEnded(TransactionStateError):
    """EndTransaction the opposite way of a decision already made."""

    code = "TRANSACTION_ALREADY_ENDED"
    protocol_code = "BAD_REQUEST"


# (state, event) -> new state. Absent pairs are illegal.
_TRANSITIONS: dict[tuple[TxnState, TxnEvent], TxnState] = {
    (TxnState.PREPARED, TxnEvent.COMMIT): TxnState.COMMITTED,
    (TxnState.PREPARED, TxnEvent.ROLLBACK): TxnState.ROLLED_BACK,
    (TxnState.PREPARED, TxnEvent.UNKNOWN): TxnState.PREPARED,
    (TxnState.PREPARED, TxnEvent.CHECK_SENT): TxnState.PREPARED,
    (TxnState.PREPARED, TxnEvent.PARK): TxnState.PARKED,
    (TxnState.PARKED, TxnEvent.RESUME): TxnState.PREPARED,
    (TxnState.PARKED, TxnEvent.COMMIT): TxnState.COMMITTED,
    (TxnState.PARKED, TxnEvent.ROLLBACK): TxnState.ROLLED_BACK,
    (TxnState.PARKED, TxnEvent.UNKNOWN): TxnState.PARKED,
    # A decision is final; repeating it, or saying "unknown" afterwards, is harmless.
    (TxnState.COMMITTED, TxnEvent.COMMIT): TxnState.COMMITTED,
    (TxnState.COMMITTED, TxnEvent.UNKNOWN): TxnState.COMMITTED,
    (TxnState.ROLLED_BACK, TxnEvent.ROLLBACK): TxnState.ROLLED_BACK,
    (TxnState.ROLLED_BACK, TxnEvent.UNKNOWN): TxnState.ROLLED_BACK,
}


def next_state(state: TxnState, event: TxnEvent, *, transaction_id: str = "") -> TxnState:
    """The state after ``event``, or a typed error when the table forbids it."""
    try:
        return _TRANSITIONS[(state, event)]
    except KeyError:
        pass
    who = f"transaction {transaction_id!r}" if transaction_id else "the transaction"
    if state.decided and event in (TxnEvent.COMMIT, TxnEvent.ROLLBACK):
        raise TransactionAlreadyEnded(
            f"{who} is already {state.value.replace('_', ' ')}; "
            f"it cannot be {'committed' if event is TxnEvent.COMMIT else 'rolled back'}"
        )
    raise TransactionStateError(f"{who} is {state.value}: {event.value} is not allowed")


def changes_state(state: TxnState, event: TxnEvent) -> bool:
    """True when ``event`` is legal and moves the transaction (so it must be persisted)."""
    return _TRANSITIONS.get((state, event), state) is not state


def legal_events(state: TxnState) -> frozenset[TxnEvent]:
    return frozenset(event for (s, event) in _TRANSITIONS if s is state)
