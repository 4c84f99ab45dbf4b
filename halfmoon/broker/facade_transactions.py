"""The broker facade's transactions role: decisions on half messages and transaction
groups, transactional consumption, and the transactions an operator lists and resumes
(see :mod:`halfmoon.broker.facade`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from halfmoon.broker.facade_types import Answer
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions import (
    DecisionSource,
    EndRequest,
    EndResult,
    Resolution,
    TransactionInfo,
    TransactionStats,
)
from halfmoon.broker.transactions.ledger import LIST_LIMIT
from halfmoon.errors import HalfmoonError


class Transactions(Protocol):
    """Transactions: decisions, transactional consumption, listing."""

    # -- transactions ------------------------------------------------------------------

    def end_transaction(
        self,
        topic: str,
        message_id: str,
        transaction_id: str,
        resolution: Resolution,
        source: DecisionSource,
        producer_group: str | None = None,
    ) -> TxnState:
        """Commit, roll back or leave (``unknown``) a transaction; returns once durable.

        ``resolution``: commit, rollback or unknown; ``source``: who decided (the producer's
        client, its answer to a check, an operator). Both enums (a str of a member's value
        is taken too, in any case for ``resolution``).
        ``topic`` and ``message_id`` may be empty (an operator knows only the id).
        Repeating a decision is a no-op; the opposite raises TransactionAlreadyEnded;
        a transaction group member is ended with its group (TransactionGroupMember).
        """
        ...

    def end_transaction_nowait(
        self,
        topic: str,
        message_id: str,
        transaction_id: str,
        resolution: Resolution,
        source: DecisionSource,
        producer_group: str | None = None,
    ) -> Answer[EndResult]:
        """As :meth:`end_transaction`, its answer (``result.state``, ``.changed``) in the one
        form every ``*_nowait`` write has: ``Written`` when decided at once without blocking
        (a pending transaction outside a group, or a recent decision: memory and an append),
        ``Pending`` when deciding blocks (an index lookup, a network hop). Awaited on an event
        loop, the answer once durable either way."""
        ...

    def end_transactions_nowait(
        self, requests: Sequence[EndRequest]
    ) -> list[Answer[EndResult] | HalfmoonError]:
        """Many :meth:`end_transaction_nowait` calls at once, in order; each request's error in
        its place. The local broker writes every decision it can make at once with one store
        append (one durable future) and leaves the others ``Pending``."""
        ...

    def end_transaction_group(
        self,
        group_id: str,
        resolution: Resolution,
        source: DecisionSource = DecisionSource.CLIENT,
        consume_actions: int | None = None,
    ) -> int:
        """Commit or roll back every member of a transaction group atomically; returns once
        durable, with the number of members decided by this call (0 when repeated).

        A commit also applies the group's consume actions (``transactional_*`` below)
        or, when one of them no longer holds, rolls everything back and raises
        ``TransactionFenced``. ``consume_actions``: how many the client registered;
        another number (the broker restarted meanwhile) rolls back and raises
        ``TransactionIncomplete``; None: no check.
        """
        ...

    def end_transaction_group_nowait(
        self,
        group_id: str,
        resolution: Resolution,
        source: DecisionSource = DecisionSource.CLIENT,
        consume_actions: int | None = None,
    ) -> Answer[int]:
        """As :meth:`end_transaction_group`, as a ``*_nowait`` answer (``Pending``: a group's
        decision reads its members back and may cross the network)."""
        ...

    def transactional_ack(
        self, transaction_group: str, group: str, topic: str, receipt_handle: str
    ) -> None:
        """Ack the delivery when ``transaction_group`` commits. The handle is checked now
        (``InvalidReceiptHandle``); nothing changes until the commit."""
        ...

    def transactional_reject(
        self,
        transaction_group: str,
        group: str,
        topic: str,
        receipt_handle: str,
        delay_ms: int | None = None,
        dead_letter: bool = False,
    ) -> None:
        """On commit, redeliver after ``delay_ms`` (None: the group's retry backoff for the
        attempt) or, with ``dead_letter``, move the message to the group's dead-letter topic
        (its copy is stored now, invisible, as a member of the group)."""
        ...

    def transactional_offset(
        self,
        transaction_group: str,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        expected: int,
    ) -> None:
        """On commit, set the pull offset of ``group`` in the queue to ``offset`` if it is still
        ``expected`` then (-1: none committed), else the commit is fenced."""
        ...

    def list_transactions(
        self, topic: str | None = None, limit: int = LIST_LIMIT
    ) -> list[TransactionInfo]:
        """Undecided transactions (prepared and parked), oldest first."""
        ...

    def parked_transactions(self, limit: int = LIST_LIMIT) -> list[TransactionInfo]:
        """Transactions parked after the check limit, oldest first."""
        ...

    def resume_transaction(self, transaction_id: str) -> TransactionInfo:
        """Put a parked transaction back under checks (check count reset)."""
        ...

    def transaction_stats(self) -> TransactionStats:
        """Pending and parked counts, decisions by source, decision latencies."""
        ...
