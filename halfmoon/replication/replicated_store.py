"""The store a sync-replicated master's broker writes to: acknowledgements wait for replicas.

The broker acknowledges a send or a transaction decision once
``store.durable(end)`` completes (``send_path``, ``transaction_operations``).
This wrapper makes that future the master's flush *and* the in-sync replicas'
acknowledgement (:meth:`ReplicationLeader.replicated`), so every path that
acknowledges through ``durable`` is replicated without the broker knowing.
``wait_durable`` (the broker's own bookkeeping: persisting progress files)
and ``put`` stay local. Everything else is the wrapped store's.

A planned switchover **fences** the store (:meth:`fence`): every append and
put is refused (``MASTER_SWITCHING``, clients retry) and the fence returns once
no append is in flight, so the log's end stays where it is while the chosen
replica catches up to it; :meth:`unfence` takes writes again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future

from halfmoon.cluster.errors import MasterSwitching
from halfmoon.replication.leader import ReplicationLeader
from halfmoon.store.api import (
    AppendResult,
    EncodedRecord,
    GetResult,
    MessagePredicate,
    StoreStats,
    TagHashes,
)
from halfmoon.store.message import Message, StoredMessage
from halfmoon.store.store import MessageStore


class ReplicatedStore:
    """A :class:`~halfmoon.store.api.Store` over a master's ``MessageStore``."""

    def __init__(self, store: MessageStore, leader: ReplicationLeader) -> None:
        self.inner = store
        self.leader = leader
        self.fenced = False
        self._writing = 0  # appends in flight
        self._gate = threading.Condition()

    def fence(self) -> None:
        """Refuse every write from now on; returns once none is in flight."""
        with self._gate:
            self.fenced = True
            while self._writing:
                self._gate.wait()

    def unfence(self) -> None:
        with self._gate:
            self.fenced = False

    def _enter(self) -> None:
        with self._gate:
            if self.fenced:
                raise MasterSwitching(
                    f"the master of group {self.leader.group} is handing over to a replica: "
                    "retry, the group's new master takes writes in a moment"
                )
            self._writing += 1

    def _leave(self) -> None:
        with self._gate:
            self._writing -= 1
            if not self._writing:
                self._gate.notify_all()

    def durable(self, end_offset: int) -> Future[None]:
        return self.leader.replicated(end_offset, self.inner.durable(end_offset))

    def close(self) -> None:
        self.inner.close()

    def append(self, messages: Sequence[Message]) -> list[AppendResult]:
        self._enter()
        try:
            return self.inner.append(messages)
        finally:
            self._leave()

    def append_encoded(self, records: Sequence[EncodedRecord]) -> list[AppendResult]:
        self._enter()
        try:
            return self.inner.append_encoded(records)
        finally:
            self._leave()

    def append_fanout(
        self, message: Message, others: Sequence[tuple[str, int]]
    ) -> list[AppendResult]:
        self._enter()
        try:
            return self.inner.append_fanout(message, others)
        finally:
            self._leave()

    def wait_durable(self, end_offset: int, timeout: float | None = None) -> bool:
        return self.inner.wait_durable(end_offset, timeout)

    def put(self, messages: Sequence[Message]) -> list[AppendResult]:
        self._enter()
        try:
            return self.inner.put(messages)
        finally:
            self._leave()

    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        max_bytes: int = 4 * 1024 * 1024,
        tag_hashes: TagHashes = None,
        predicate: MessagePredicate | None = None,
    ) -> GetResult:
        return self.inner.get(
            topic, queue_id, offset, max_messages, max_bytes, tag_hashes, predicate
        )

    def read_at(self, commit_log_offset: int) -> StoredMessage:
        return self.inner.read_at(commit_log_offset)

    def query_by_key(
        self,
        topic: str,
        key: str,
        begin_timestamp: int = 0,
        end_timestamp: int = 2**63 - 1,
        max_results: int = 64,
    ) -> list[StoredMessage]:
        return self.inner.query_by_key(topic, key, begin_timestamp, end_timestamp, max_results)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self.inner.min_offset(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self.inner.max_offset(topic, queue_id)

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp: int) -> int:
        return self.inner.offset_for_timestamp(topic, queue_id, timestamp)

    def queues(self) -> Iterable[tuple[str, int]]:
        return self.inner.queues()

    def delete_topic(self, topic: str) -> None:
        self.inner.delete_topic(topic)

    def add_listener(self, listener: Callable[[AppendResult], None]) -> None:
        self.inner.add_listener(listener)

    def add_batch_listener(self, listener: Callable[[list[AppendResult]], None]) -> None:
        self.inner.add_batch_listener(listener)

    def stats(self) -> StoreStats:
        return self.inner.stats()
