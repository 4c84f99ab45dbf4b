"""Transactions through a proxy: each call goes to the broker its transaction id, receipt
handle or queue names (:mod:`halfmoon.cluster.proxy.routing`), and what a broker answers is
given back with cluster ids.

A transaction group goes to any one broker, which forwards it to the group's coordinator
broker (:mod:`halfmoon.cluster.internal.txn_groups`); a transactional ack, reject or offset commit
goes to the broker holding the message or queue (which must be the group's coordinator).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from halfmoon.broker.facade_types import Answer, Pending, waits_for
from halfmoon.broker.transactions import EndResult, TransactionInfo, TransactionStats
from halfmoon.broker.transactions.ledger import LIST_LIMIT
from halfmoon.broker.transactions.resolutions import DecisionSource, Resolution
from halfmoon.cluster.proxy.broker_pool import BrokerPool
from halfmoon.cluster.proxy.cluster_reads import ClusterReads
from halfmoon.cluster.proxy.routing import qualify, unqualify


class ClusterTransactions:
    """The transaction operations of the facade over the pool's brokers."""

    def __init__(self, pool: BrokerPool, reads: ClusterReads) -> None:
        self.pool = pool
        self.reads = reads  # a cluster queue's broker, for a transactional offset commit

    def end_transaction_nowait(
        self,
        topic: str,
        message_id: str,
        transaction_id: str,
        resolution: Resolution,
        source: DecisionSource,
        producer_group: str | None = None,
    ) -> Answer[EndResult]:
        broker, own = unqualify(transaction_id, "transaction id")
        return self.pool.broker(broker).end_transaction_nowait(
            topic, message_id, own, resolution, source, producer_group
        )

    end_transaction = waits_for(end_transaction_nowait, lambda ended: ended.state)

    def end_transaction_group_nowait(
        self,
        group_id: str,
        resolution: Resolution,
        source: DecisionSource = DecisionSource.CLIENT,
        consume_actions: int | None = None,
    ) -> Answer[int]:
        # The seam with transaction groups spanning brokers: any broker takes the call and
        # forwards it to the group's coordinator broker (halfmoon/cluster/internal/txn_groups.py),
        # which decides first and then has the participants apply the decision.
        return Pending.of_durable(
            partial(self._end_group, group_id, resolution, source, consume_actions)
        )

    def _end_group(
        self,
        group_id: str,
        resolution: Resolution,
        source: DecisionSource,
        consume_actions: int | None,
    ) -> int:
        return self.pool.any_broker().end_transaction_group(
            group_id, resolution, source, consume_actions
        )

    end_transaction_group = waits_for(end_transaction_group_nowait)

    def transactional_ack(
        self, transaction_group: str, group: str, topic: str, receipt_handle: str
    ) -> None:
        broker, own = unqualify(receipt_handle, "receipt handle")
        self.pool.broker(broker).transactional_ack(transaction_group, group, topic, own)

    def transactional_reject(
        self,
        transaction_group: str,
        group: str,
        topic: str,
        receipt_handle: str,
        delay_ms: int | None = None,
        dead_letter: bool = False,
    ) -> None:
        broker, own = unqualify(receipt_handle, "receipt handle")
        self.pool.broker(broker).transactional_reject(
            transaction_group, group, topic, own, delay_ms, dead_letter
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
        _, where = self.reads.locate(topic, queue_id)
        self.pool.broker(where.broker).transactional_offset(
            transaction_group, group, topic, where.broker_queue, offset, expected
        )

    def list_transactions(
        self, topic: str | None = None, limit: int = LIST_LIMIT
    ) -> list[TransactionInfo]:
        found: list[TransactionInfo] = []
        for broker, answer in self.pool.fan_out(
            list(self.pool.connected()),
            lambda b: b.list_transactions(topic, limit),
            skip_missing=True,
        ):
            found.extend(
                replace(t, transaction_id=qualify(broker, t.transaction_id)) for t in answer
            )
        return found[:limit]

    def parked_transactions(self, limit: int = LIST_LIMIT) -> list[TransactionInfo]:
        found: list[TransactionInfo] = []
        for broker, answer in self.pool.fan_out(
            list(self.pool.connected()), lambda b: b.parked_transactions(limit)
        ):
            found.extend(
                replace(t, transaction_id=qualify(broker, t.transaction_id)) for t in answer
            )
        return found[:limit]

    def resume_transaction(self, transaction_id: str) -> TransactionInfo:
        broker, own = unqualify(transaction_id, "transaction id")
        info = self.pool.broker(broker).resume_transaction(own)
        return replace(info, transaction_id=transaction_id)

    def transaction_stats(self) -> TransactionStats:
        return self.pool.any_broker().transaction_stats()
