"""``ClusterBroker``: the ``Broker`` facade over every broker of a cluster, routed by etcd.

What a proxy's front end drives in cluster mode. Each operation goes to the
broker owning the queue, receipt handle, recall handle or transaction it
names (:mod:`halfmoon.cluster.proxy.routing`), or to every broker holding the
topic, answers merged. Topics and groups are written to etcd first (the
record every proxy routes by), then created on the brokers.

- **Topics and groups** (:mod:`halfmoon.cluster.proxy.cluster_topics`): etcd first,
  then the brokers holding them.
- **Sends** (:mod:`halfmoon.cluster.proxy.cluster_sends`): a message without a queue
  gets one, as a broker would pick it (:mod:`halfmoon.cluster.proxy.send_plan`). The
  messages of one call are split by broker, each part going through that
  broker's coalescing sender.
- **Receives** (:mod:`halfmoon.cluster.proxy.cluster_receives`): every broker holding
  the topic, starting at a rotating one, until the batch is full; the front
  end's long poll wakes on arrivals from any of them (the pool's translated
  listeners).
- **Transactions** (:mod:`halfmoon.cluster.proxy.cluster_transactions`): a transaction
  group goes to any one broker, which forwards it to the group's coordinator
  broker (:mod:`halfmoon.cluster.internal.txn_groups`); a transactional ack, reject or
  offset commit goes to the broker holding the message or queue (which must be
  the group's coordinator).
- **Reads by queue** (pull, offsets, stored messages, lite topics):
  :mod:`halfmoon.cluster.proxy.cluster_reads`.

The connections to the brokers and what the proxy knows of each topic's layout
are the :class:`~halfmoon.cluster.proxy.broker_pool.BrokerPool`, which this class
holds and shares with those parts. An operation a part serves as it is is
declared with :func:`~halfmoon.delegation.delegate` (the part's method
is the one place its signature is written); what is written out here merges
or combines the parts' answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from halfmoon.broker.config import BrokerConfig
from halfmoon.broker.facade import (
    Answer,
    end_each,
)
from halfmoon.broker.facade_types import deferred, waits_for
from halfmoon.broker.statistics import TrafficRow
from halfmoon.broker.stats import BrokerStatus
from halfmoon.broker.transactions import EndRequest, EndResult
from halfmoon.cluster.coordination.metadata import ClusterMetadata
from halfmoon.cluster.coordination.view import ClusterView
from halfmoon.cluster.internal import network_hop
from halfmoon.cluster.internal.internal_tls import PLAINTEXT, InternalTls
from halfmoon.cluster.proxy.broker_pool import BrokerPool, Connect
from halfmoon.cluster.proxy.cluster_reads import ClusterReads
from halfmoon.cluster.proxy.cluster_receives import ClusterReceives
from halfmoon.cluster.proxy.cluster_sends import ClusterSends
from halfmoon.cluster.proxy.cluster_topics import ClusterTopics
from halfmoon.cluster.proxy.cluster_transactions import ClusterTransactions
from halfmoon.delegation import delegate
from halfmoon.errors import HalfmoonError
from halfmoon.store.api import StoreStats


class ClusterBroker:
    """The facade over the pool's brokers. Each operation is served by the part it
    belongs to (topics and groups, sends, receives, transactions, reads by queue); the
    settings, statistics and fanout sends, which merge or combine those, are here."""

    def __init__(
        self,
        view: ClusterView,
        metadata: ClusterMetadata,
        loop: asyncio.AbstractEventLoop,
        *,
        connect: Connect | None = None,
        tls: InternalTls = PLAINTEXT,
    ) -> None:
        self.pool = BrokerPool(view, metadata, loop, connect=connect, tls=tls)
        self.topics = ClusterTopics(self.pool)
        self.sends = ClusterSends(self.pool, self.topics)
        self.reads = ClusterReads(self.pool)
        self.transactions = ClusterTransactions(self.pool, self.reads)
        self.receives = ClusterReceives(self.pool, self.topics)

    # -- the event loop's fast paths: declined, every call crosses the network -------------

    ack_nowait = network_hop.ack_nowait
    receive_nowait = network_hop.receive_nowait

    # -- lifecycle and settings ----------------------------------------------------------------

    @property
    def config(self) -> BrokerConfig:
        return self.pool.any_broker().config

    def update_config(self, changes: Mapping[str, Any]) -> BrokerConfig:
        answers = self.pool.fan_out(list(self.pool.connected()), lambda b: b.update_config(changes))
        return answers[0][1]

    def close(self) -> None:
        self.pool.close_connections()

    def tick(self) -> bool:
        return False  # every broker process ticks itself

    def status(self) -> BrokerStatus:
        return self.pool.any_broker().status()

    def store_stats(self) -> StoreStats:
        return self.pool.any_broker().store_stats()

    def counted_metrics(self) -> list[list[Any]]:
        """Every reachable broker's counters, each sample labelled with its broker."""
        out: list[list[Any]] = []
        for name, answer in self.pool.fan_out(
            list(self.pool.connected()), lambda b: b.counted_metrics(), skip_missing=True
        ):
            for family_name, kind, help, samples in answer:
                labelled = [[{**labels, "broker": name}, value] for labels, value in samples]
                out.append([family_name, kind, help, labelled])
        return out

    def traffic(self, topic: str | None = None, group: str | None = None) -> list[TrafficRow]:
        rows: list[TrafficRow] = []
        for _, answer in self.pool.fan_out(
            list(self.pool.connected()), lambda b: b.traffic(topic, group)
        ):
            rows.extend(answer)
        return rows

    def traffic_history(
        self, topic: str | None = None, group: str | None = None, minutes: int = 60
    ) -> dict[str, Any]:
        """Every reachable broker's history, summed step by step (the steps are whole
        minutes of the same clock, so they line up)."""
        answers = [
            answer
            for _, answer in self.pool.fan_out(
                list(self.pool.connected()), lambda b: b.traffic_history(topic, group, minutes)
            )
        ]
        if not answers:
            return {"minutes": minutes, "step_ms": 0, "start_ms": 0, "series": {}}
        merged = dict(answers[0])
        merged["series"] = {
            kind: [
                sum(values) for values in zip(*(a["series"][kind] for a in answers), strict=True)
            ]
            for kind in answers[0]["series"]
        }
        return merged

    # -- the pool: connections and their listeners (broker_pool.py) ----------------------------

    sync_connections = delegate("pool", BrokerPool.sync_connections)
    broker = delegate("pool", BrokerPool.broker)
    connected = delegate("pool", BrokerPool.connected)
    follow_view = delegate("pool", BrokerPool.follow_view)
    keep_writability_fresh = delegate("pool", BrokerPool.keep_writability_fresh)
    add_arrival_listener = delegate("pool", BrokerPool.add_arrival_listener)
    add_watched_arrival_listener = delegate("pool", BrokerPool.add_watched_arrival_listener)
    watch_arrivals = delegate("pool", BrokerPool.watch_arrivals)
    unwatch_arrivals = delegate("pool", BrokerPool.unwatch_arrivals)
    set_check_sender = delegate("pool", BrokerPool.set_check_sender)
    set_lite_unsubscribe_notifier = delegate("pool", BrokerPool.set_lite_unsubscribe_notifier)

    # -- topics and consumer groups (cluster_topics.py) ----------------------------------------

    create_topic = delegate("topics", ClusterTopics.create_topic)
    update_topic = delegate("topics", ClusterTopics.update_topic)
    delete_topic = delegate("topics", ClusterTopics.delete_topic)
    unused_topics = delegate("topics", ClusterTopics.unused_topics)
    get_topic = delegate("topics", ClusterTopics.get_topic)
    find_topic = delegate("topics", ClusterTopics.find_topic)
    list_topics = delegate("topics", ClusterTopics.list_topics)
    topic_status = delegate("topics", ClusterTopics.topic_status)
    route = delegate("topics", ClusterTopics.route)
    create_group = delegate("topics", ClusterTopics.create_group)
    update_group = delegate("topics", ClusterTopics.update_group)
    delete_group = delegate("topics", ClusterTopics.delete_group)
    get_group = delegate("topics", ClusterTopics.get_group)
    find_group = delegate("topics", ClusterTopics.find_group)
    list_groups = delegate("topics", ClusterTopics.list_groups)
    group_progress = delegate("topics", ClusterTopics.group_progress)
    subscribe = delegate("topics", ClusterTopics.subscribe)

    # -- produce (cluster_sends.py) ------------------------------------------------------------

    send_nowait = delegate("sends", ClusterSends.send_nowait)
    send = waits_for(send_nowait)
    recall = delegate("sends", ClusterSends.recall)
    send_fanout = delegate("sends", ClusterSends.send_fanout)
    # Each broker answers once its writes are durable: a fanout is a call that blocks till then.
    send_fanout_nowait = deferred(send_fanout)

    # -- transactions (cluster_transactions.py) ------------------------------------------------

    def end_transactions_nowait(
        self, requests: Sequence[EndRequest]
    ) -> list[Answer[EndResult] | HalfmoonError]:
        return end_each(self, requests)  # no batching across the internal protocol (yet)

    end_transaction = delegate("transactions", ClusterTransactions.end_transaction)
    end_transaction_nowait = delegate("transactions", ClusterTransactions.end_transaction_nowait)
    end_transaction_group = delegate("transactions", ClusterTransactions.end_transaction_group)
    end_transaction_group_nowait = delegate(
        "transactions", ClusterTransactions.end_transaction_group_nowait
    )
    transactional_ack = delegate("transactions", ClusterTransactions.transactional_ack)
    transactional_reject = delegate("transactions", ClusterTransactions.transactional_reject)
    transactional_offset = delegate("transactions", ClusterTransactions.transactional_offset)
    list_transactions = delegate("transactions", ClusterTransactions.list_transactions)
    parked_transactions = delegate("transactions", ClusterTransactions.parked_transactions)
    resume_transaction = delegate("transactions", ClusterTransactions.resume_transaction)
    transaction_stats = delegate("transactions", ClusterTransactions.transaction_stats)

    # -- consume by pop (cluster_receives.py) --------------------------------------------------

    receive = delegate("receives", ClusterReceives.receive)
    next_wakeup_ms = delegate("receives", ClusterReceives.next_wakeup_ms)
    ack = delegate("receives", ClusterReceives.ack)
    change_invisible_duration = delegate("receives", ClusterReceives.change_invisible_duration)
    forward_to_dead_letter = delegate("receives", ClusterReceives.forward_to_dead_letter)

    # -- reads by queue, stored messages, lite topics (cluster_reads.py) -----------------------

    pull = delegate("reads", ClusterReads.pull)
    bulk_read = delegate("reads", ClusterReads.bulk_read)
    get_offset = delegate("reads", ClusterReads.get_offset)
    update_offset = delegate("reads", ClusterReads.update_offset)
    query_offset = delegate("reads", ClusterReads.query_offset)
    reset_offset = delegate("reads", ClusterReads.reset_offset)
    seek_group = delegate("reads", ClusterReads.seek_group)
    messages_by_id = delegate("reads", ClusterReads.messages_by_id)
    message_trace = delegate("reads", ClusterReads.message_trace)
    messages_by_key = delegate("reads", ClusterReads.messages_by_key)
    message_at = delegate("reads", ClusterReads.message_at)
    scan = delegate("reads", ClusterReads.scan)
    sync_lite_subscription = delegate("reads", ClusterReads.sync_lite_subscription)
    list_lite_topics = delegate("reads", ClusterReads.list_lite_topics)
    client_terminated = delegate("reads", ClusterReads.client_terminated)
    lite_subscriptions = delegate("reads", ClusterReads.lite_subscriptions)
    delete_lite_topic = delegate("reads", ClusterReads.delete_lite_topic)
