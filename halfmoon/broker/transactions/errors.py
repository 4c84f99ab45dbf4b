"""Errors a producer or an operator can cause with transactions (stable codes)."""

from __future__ import annotations

from halfmoon.broker.transaction_state import TransactionAlreadyEnded, TransactionStateError
from halfmoon.errors import InvalidArgument


class InvalidTransactionId(InvalidArgument):
    """Not a transaction id this broker issued, or one whose half message is gone."""

    code = "INVALID_TRANSACTION_ID"


def unknown_transaction(transaction_id: str) -> InvalidTransactionId:
    """The answer for a transaction that does not exist, or not in the topic the caller named:
    the same words, so a caller cannot tell one from the other."""
    return InvalidTransactionId(
        f"no transaction {transaction_id!r} is known; use the transaction id from the send "
        "result of the half message, with the topic it was sent to"
    )


class IllegalTransactionGroup(InvalidArgument):
    code = "ILLEGAL_TRANSACTION_GROUP"
    protocol_code = "BAD_REQUEST"


class TransactionGroupMember(TransactionStateError):
    """A member of a transaction group ended on its own: only the group decides."""

    code = "TRANSACTION_GROUP_MEMBER"
    protocol_code = "BAD_REQUEST"


class TransactionGroupEnded(TransactionAlreadyEnded):
    """A half message sent to a transaction group that is already committed or rolled back."""


__all__ = [
    "IllegalTransactionGroup",
    "InvalidTransactionId",
    "TransactionAlreadyEnded",
    "TransactionGroupEnded",
    "TransactionGroupMember",
    "TransactionStateError",
    "unknown_transaction",
]
