"""The transaction operations of the ``Broker`` facade (an object the in-process
:class:`halfmoon.broker.broker.Broker` holds and delegates to): decisions on half messages and
transaction groups, transactional consumption (acks, rejects and offset
commits decided with a group), listing and stats. The work is done by the
transaction service (:mod:`halfmoon.broker.transactions`) and
:mod:`halfmoon.broker.transactional_consume`; this class maps the facade's
calls onto them and hands back :class:`Written` answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from functools import partial

from halfmoon.broker.facade_types import ALREADY_DURABLE, Answer, Pending, Written, waits_for
from halfmoon.broker.topics import TopicRegistry
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactional_consume import TransactionalConsume
from halfmoon.broker.transactions import (
    CheckSender,
    CheckService,
    EndRequest,
    EndResult,
    TransactionInfo,
    TransactionService,
    TransactionStats,
)
from halfmoon.broker.transactions.ledger import LIST_LIMIT
from halfmoon.broker.transactions.resolutions import DecisionSource, Resolution
from halfmoon.errors import HalfmoonError
from halfmoon.store.api import Store


class TransactionOperations:
    def __init__(
        self,
        transactions: TransactionService,
        consuming: TransactionalConsume,
        checks: CheckService,
        topics: TopicRegistry,
        store: Store,
        wake: Callable[[str, int], None],
    ) -> None:
        """``store``: whose ``durable`` future an answer waits for (asked at each answer, as
        the rest of the broker asks it); ``wake``: tells the arrival listeners that a topic's
        queue may have something to deliver."""
        self.transactions = transactions
        self.consuming = consuming
        self._checks = checks
        self._topics = topics
        self._store = store
        self._wake = wake

    def end_transaction_nowait(
        self,
        topic: str,
        message_id: str,
        transaction_id: str,
        resolution: Resolution,
        source: DecisionSource,
        producer_group: str | None = None,
    ) -> Answer[EndResult]:
        """Decided now when that is memory and an append (a pending transaction outside a
        group, a recent decision, an id that does not parse); an index lookup or a group's
        members are left to the answer."""
        request = EndRequest(transaction_id, resolution, source, message_id, topic)
        if self.transactions.ends_cheaply(transaction_id):
            return self._end_now(request)
        return Pending(partial(self._end_now, request))

    end_transaction = waits_for(end_transaction_nowait, lambda ended: ended.state)

    def _end_now(self, request: EndRequest) -> Written[EndResult]:
        result = self.transactions.end(
            request.transaction_id,
            request.resolution,
            request.source,
            message_id=request.message_id,
            topic=request.topic,
        )
        return Written(result, self._durable(result.end_offset))

    def end_transactions_nowait(
        self, requests: Sequence[EndRequest]
    ) -> list[Answer[EndResult] | HalfmoonError]:
        """One append for every decision made now; one durable future, for the last record,
        shared by every result that has something to wait for (one fsync covers them all).
        A decision that needs a lookup is a ``Pending`` of its own, in its place."""
        cheap = [self.transactions.ends_cheaply(r.transaction_id) for r in requests]
        now_ones = [r for r, now in zip(requests, cheap, strict=True) if now]
        decided = self.transactions.end_many(now_ones)
        end_offset = max((r.end_offset for r in decided if isinstance(r, EndResult)), default=0)
        durable = self._durable(end_offset)
        results = iter(decided)
        answers: list[Answer[EndResult] | HalfmoonError] = []
        for request, now in zip(requests, cheap, strict=True):
            if not now:
                answers.append(Pending(partial(self._end_now, request)))
                continue
            result = next(results)
            answers.append(
                result
                if isinstance(result, HalfmoonError)
                else Written(result, durable if result.end_offset else ALREADY_DURABLE)
            )
        return answers

    def end_transaction_group_nowait(
        self,
        group_id: str,
        resolution: Resolution,
        source: DecisionSource = DecisionSource.CLIENT,
        consume_actions: int | None = None,
    ) -> Answer[int]:
        """Left to the answer: a group's decision reads its members' half messages back."""
        return Pending(partial(self._end_group_now, group_id, resolution, source, consume_actions))

    def _end_group_now(
        self,
        group_id: str,
        resolution: Resolution,
        source: DecisionSource,
        consume_actions: int | None,
    ) -> Written[int]:
        ended = self.consuming.end(group_id, resolution, source, consume_actions)
        for topic in ended.topics:  # acks free FIFO queues, rejects move wake-up times
            for queue_id in self._topics.readable_queue_ids(topic):
                self._wake(topic, queue_id)
        return Written(ended.members, self._durable(ended.end_offset))

    end_transaction_group = waits_for(end_transaction_group_nowait)

    # -- transactional consumption (halfmoon/broker/transactional_consume.py) -------------
    def transactional_ack(
        self, transaction_group: str, group: str, topic: str, receipt_handle: str
    ) -> None:
        self.consuming.ack(transaction_group, group, topic, receipt_handle)

    def transactional_reject(
        self,
        transaction_group: str,
        group: str,
        topic: str,
        receipt_handle: str,
        delay_ms: int | None = None,
        dead_letter: bool = False,
    ) -> None:
        self.consuming.reject(
            transaction_group, group, topic, receipt_handle, delay_ms, dead_letter
        )

    def transactional_offset(
        self,
        transaction_group: str,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        expected: int,
    ) -> None:
        self.consuming.commit_offset(transaction_group, group, topic, queue_id, offset, expected)

    def _durable(self, end_offset: int) -> Future[None]:
        return self._store.durable(end_offset) if end_offset else ALREADY_DURABLE

    def list_transactions(
        self, topic: str | None = None, limit: int = LIST_LIMIT
    ) -> list[TransactionInfo]:
        return self.transactions.list(
            topic=topic, limit=limit, next_check=self._checks.next_check_ms
        )

    def parked_transactions(self, limit: int = LIST_LIMIT) -> list[TransactionInfo]:
        return self.transactions.list(state=TxnState.PARKED, limit=limit)

    def resume_transaction(self, transaction_id: str) -> TransactionInfo:
        info = self.transactions.resume(transaction_id)
        return replace(info, next_check_ms=self._checks.next_scan_ms)

    def set_check_sender(self, sender: CheckSender | None) -> None:
        self._checks.set_sender(sender)

    def transaction_stats(self) -> TransactionStats:
        return self.transactions.stats()
