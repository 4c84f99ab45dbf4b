"""What a decision names: its resolution (commit, rollback, unknown) and who made it (the
producer's client, an answer to a check, an operator).

Both cross the broker facade as enums, made once by the front end that read them off its
wire (a gRPC enum, an admin API path, an AMQP method). A broker still takes them by value,
in any case (``"COMMIT"``): a decision may arrive over the internal protocol or from a
script, and :meth:`Resolution.of` and :meth:`DecisionSource.of` refuse anything else with
``INVALID_ARGUMENT``; an enum member passes at the cost of a type check.
"""

from __future__ import annotations

import enum

from halfmoon.broker.transaction_state import TxnEvent
from halfmoon.errors import InvalidArgument


class Resolution(enum.StrEnum):
    """A decision on a transaction or a transaction group."""

    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"  # the producer does not know yet: the checks ask again

    @property
    def event(self) -> TxnEvent:
        """The transition the decision is in the transaction's state machine."""
        return _EVENTS[self]

    @classmethod
    def of(cls, value: Resolution | str) -> Resolution:
        if type(value) is cls:
            return value
        try:
            return cls(value.lower())
        except (ValueError, AttributeError):
            raise InvalidArgument(
                f"unknown transaction resolution {value!r}: use commit, rollback or unknown"
            ) from None


class DecisionSource(enum.StrEnum):
    """Who made a decision."""

    CLIENT = "client"  # the producer, with EndTransaction (or an AMQP channel's tx.commit)
    CHECK = "check"  # a producer's answer to a check (or the broker giving up on a group)
    OPERATOR = "operator"  # the admin API or the CLI

    @property
    def decider(self) -> str:
        """Who decided, as the message trace says it."""
        return "producer" if self is DecisionSource.CLIENT else self.value

    @classmethod
    def of(cls, value: DecisionSource | str) -> DecisionSource:
        if type(value) is cls:
            return value
        try:
            return cls(value)
        except ValueError:
            raise InvalidArgument(
                f"unknown transaction source {value!r}: use client, check or operator"
            ) from None


_EVENTS = {
    Resolution.COMMIT: TxnEvent.COMMIT,
    Resolution.ROLLBACK: TxnEvent.ROLLBACK,
    Resolution.UNKNOWN: TxnEvent.UNKNOWN,
}
