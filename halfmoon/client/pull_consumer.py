"""PullConsumer: read queues by offset, at your own pace, and commit where you are.

Two ways to get queues, as in RocketMQ's LitePullConsumer:

* ``assign(queues)``: exactly these queues, no group coordination.
* subscriptions (``subscribe(topic)`` or the constructor): the group's
  members share the topics' queues. Members find each other through
  :class:`~halfmoon.client.membership.TopicMembership` and each takes its share
  by the allocation strategy (``"average"`` or ``"consistent_hash"``); when a
  member joins or leaves, every member rebalances: a queue it loses is
  committed at its position and dropped, a queue it gains starts at the
  group's committed offset (or ``consume_from`` when there is none).

``poll()`` returns the next messages of the assigned queues and moves the
position (reading through ``halfmoon.v1.BulkRead``, up to ``batch_size``
messages per queue and call; PullMessage against a server without it);
``commit()`` stores positions on the server (``UpdateOffset``), and with
``auto_commit`` that happens every ``auto_commit_interval`` seconds and
on close. ``seek`` moves a position (to an offset, the beginning, the end, or
a timestamp).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from halfmoon.client.allocation import AllocationStrategy, strategy_named
from halfmoon.client.bulk_read import bulk_read
from halfmoon.client.client import as_config
from halfmoon.client.connection import ClientConfig, new_client_id
from halfmoon.client.consume_transaction import ConsumeTransaction
from halfmoon.client.consumer import ConsumerBase, cancel_and_wait
from halfmoon.client.errors import ClientError, OffsetNotFound, Unsupported
from halfmoon.client.membership import MEMBERS_TOPIC, TopicMembership
from halfmoon.client.message import MessageView
from halfmoon.client.producer import Producer
from halfmoon.client.route import QueueInfo
from halfmoon.client.selector import ALL, MessageSelector
from halfmoon.client.transaction import TransactionProducer

log = logging.getLogger("halfmoon.client.pull")


def queue_key(queue: QueueInfo) -> str:
    return f"{queue.topic}/{queue.key}"


class PullConsumer(ConsumerBase):
    """Offset-based consumption with commit, seek and group rebalancing."""

    client_type = pb.ClientType.PULL_CONSUMER

    def __init__(
        self,
        config: ClientConfig | str,
        group: str,
        subscriptions: Mapping[str, MessageSelector] | None = None,
        *,
        allocation: str | AllocationStrategy = "average",
        auto_commit: bool = True,
        auto_commit_interval: float = 5.0,
        consume_from: str = "latest",
        batch_size: int = 32,
        membership_topic: str = MEMBERS_TOPIC,
        membership_interval: float = 1.0,
        **options: Any,
    ) -> None:
        super().__init__(as_config(config, **options), group, subscriptions)
        if consume_from not in ("latest", "earliest"):
            raise ValueError("consume_from must be 'latest' or 'earliest'")
        self.allocate = strategy_named(allocation)
        self.auto_commit = auto_commit
        self.auto_commit_interval = auto_commit_interval
        self.consume_from = consume_from
        self.batch_size = batch_size
        self.membership_topic = membership_topic
        self.membership_interval = membership_interval
        self._assigned: dict[str, QueueInfo] = {}
        self._positions: dict[str, int] = {}
        self._committed: dict[str, int] = {}
        self._manual = False
        self._membership: TopicMembership | None = None
        self._membership_producer: Producer | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._lock = asyncio.Lock()
        self._last_commit = 0.0
        self._no_bulk_read: set[str] = set()  # endpoints without halfmoon.v1.BulkRead
        self.rebalances = 0

    # -- lifecycle ------------------------------------------------------------------------

    async def _on_started(self) -> None:
        await super()._on_started()
        if self.subscriptions:
            await self._join_group()

    async def _join_group(self) -> None:
        if self._membership is not None:
            return
        producer_config = ClientConfig(**{**self.config.__dict__, "client_id": new_client_id()})
        self._membership_producer = Producer(
            producer_config, topics=[self.membership_topic], max_attempts=2
        )
        await self._membership_producer.start()
        self._membership = TopicMembership(
            self, self._membership_producer, self.membership_topic, self.membership_interval
        )
        await self._membership.start()
        await self.rebalance()
        self._tasks.append(
            asyncio.create_task(self._membership.run(), name=f"halfmoon-members-{self.group}")
        )
        self._tasks.append(
            asyncio.create_task(self._rebalance_loop(), name=f"halfmoon-rebalance-{self.group}")
        )

    async def _on_closing(self) -> None:
        await cancel_and_wait(self._tasks)
        if self.auto_commit and self._started:
            with contextlib.suppress(ClientError):
                await self._commit_keys(list(self._assigned))
        if self._membership is not None:
            await self._membership.leave()
        if self._membership_producer is not None:
            await self._membership_producer.close()

    # -- assignment -------------------------------------------------------------------------

    async def fetch_queues(self, topic: str) -> list[QueueInfo]:
        """The readable queues of ``topic`` (fresh from the server)."""
        self._check_open()
        return (await self.routes.refresh(topic)).readable()

    async def assign(self, queues: Iterable[QueueInfo]) -> None:
        """Read exactly ``queues`` (manual mode: no group rebalancing)."""
        self._check_open()
        self._manual = True
        async with self._lock:
            await self._set_assignment({queue_key(q): q for q in queues})

    def assignment(self) -> list[QueueInfo]:
        """The queues this consumer reads now."""
        return list(self._assigned.values())

    async def subscribe(self, topic: str, selector: MessageSelector = ALL) -> None:
        """Join the group's share of ``topic`` (rebalanced as members come and go)."""
        await super().subscribe(topic, selector)
        if self._membership is None:
            await self._join_group()
        else:
            await self.rebalance()

    async def rebalance(self) -> None:
        """Recompute this member's queues from the live members (runs on membership changes)."""
        if self._manual or self._membership is None:
            return
        async with self._lock:
            everything: dict[str, QueueInfo] = {}
            for topic in self.subscriptions:
                for queue in (await self.routes.get(topic)).readable():
                    everything[queue_key(queue)] = queue
            mine = self.allocate(sorted(everything), self._membership.members(), self.client_id)
            if set(mine) != set(self._assigned):
                self.rebalances += 1
                log.info(
                    "event=rebalance group=%s members=%d queues=%s",
                    self.group,
                    len(self._membership.members()),
                    sorted(mine),
                )
            await self._set_assignment({k: everything[k] for k in mine})

    async def _set_assignment(self, wanted: dict[str, QueueInfo]) -> None:
        gone = [k for k in self._assigned if k not in wanted]
        if gone and self.auto_commit:
            await self._commit_keys(gone)
        for key in gone:
            self._assigned.pop(key, None)
            self._positions.pop(key, None)
            self._committed.pop(key, None)
        for key, queue in wanted.items():
            if key not in self._assigned:
                self._positions[key] = await self._start_offset(queue)
                self._assigned[key] = queue

    async def _start_offset(self, queue: QueueInfo) -> int:
        try:
            offset = await self._get_offset(queue)
            self._committed[queue_key(queue)] = offset
            return offset
        except OffsetNotFound:
            return await self._query_offset(queue, self.consume_from)

    async def _rebalance_loop(self) -> None:
        assert self._membership is not None
        while True:
            await self._membership.changed.wait()
            self._membership.changed.clear()
            try:
                await self.rebalance()
            except ClientError as exc:
                log.info("event=rebalance_failed group=%s error=%s", self.group, exc)

    # -- reading ------------------------------------------------------------------------------

    async def poll(self, timeout: float = 1.0) -> list[MessageView]:
        """The next messages of the assigned queues, waiting up to ``timeout`` seconds for some."""
        self._check_open()
        if not self._assigned:
            await asyncio.sleep(min(timeout, 0.1))
            return []
        queues = list(self._assigned.values())
        pulls = {asyncio.ensure_future(self._pull_queue(q, timeout)): q for q in queues}
        messages: list[MessageView] = []
        pending = set(pulls)
        try:
            while pending and not messages:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task.exception() is None:
                        messages.extend(task.result())
                    else:
                        log.info(
                            "event=pull_failed queue=%s error=%s",
                            queue_key(pulls[task]),
                            task.exception(),
                        )
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self._maybe_auto_commit()
        return messages

    async def _pull_queue(self, queue: QueueInfo, wait: float) -> list[MessageView]:
        key = queue_key(queue)
        offset = self._positions.get(key)
        if offset is None:
            return []
        selector = self.subscriptions.get(queue.topic, ALL)
        messages, next_offset = await self._read(queue, offset, selector, wait)
        # A rebalance or seek meanwhile wins: drop what was read for the old position.
        if self._assigned.get(key) is None or self._positions.get(key) != offset:
            return []
        self._positions[key] = next_offset
        return messages

    async def _read(
        self, queue: QueueInfo, offset: int, selector: MessageSelector, wait: float
    ) -> tuple[list[MessageView], int]:
        """BulkRead where the server has it, PullMessage (at most 1024) where it does not."""
        endpoint = queue.endpoint
        if endpoint not in self._no_bulk_read:
            try:
                return await bulk_read(
                    self._pool.get(endpoint),
                    self.group,
                    queue,
                    offset,
                    self.batch_size,
                    selector,
                    wait,
                    self.config.request_timeout,
                )
            except Unsupported:
                log.info("event=bulk_read_unsupported endpoint=%s", endpoint)
                self._no_bulk_read.add(endpoint)
        return await self._pull(queue, offset, min(self.batch_size, 1024), selector, wait)

    # -- positions and commits -------------------------------------------------------------------

    def position(self, queue: QueueInfo) -> int:
        """The offset the next poll reads from in ``queue``."""
        return self._positions[queue_key(queue)]

    async def seek(self, queue: QueueInfo, offset: int) -> None:
        """Read ``queue`` from ``offset`` next."""
        key = queue_key(queue)
        if key not in self._assigned:
            raise ValueError(f"queue {key} is not assigned to this consumer")
        self._positions[key] = offset

    async def seek_to_beginning(self, queue: QueueInfo) -> None:
        await self.seek(queue, await self._query_offset(queue, "earliest"))

    async def seek_to_end(self, queue: QueueInfo) -> None:
        await self.seek(queue, await self._query_offset(queue, "latest"))

    async def seek_to_timestamp(self, queue: QueueInfo, timestamp_ms: int) -> None:
        """Read ``queue`` from the first message stored at or after ``timestamp_ms``."""
        await self.seek(queue, await self._query_offset(queue, "timestamp", timestamp_ms))

    async def committed(self, queue: QueueInfo) -> int | None:
        """The group's committed offset for ``queue`` on the server (None if never committed)."""
        try:
            return await self._get_offset(queue)
        except OffsetNotFound:
            return None

    async def commit(self, offsets: Mapping[QueueInfo, int] | None = None) -> None:
        """Store positions (or the given ``offsets``) as the group's committed offsets."""
        self._check_open()
        if offsets is not None:
            for queue, offset in offsets.items():
                await self._update_offset(queue, offset)
                self._committed[queue_key(queue)] = offset
            return
        await self._commit_keys(list(self._assigned))

    # -- transactional commits (consume_transaction.py) -----------------------------------------

    def transaction(
        self,
        producer: TransactionProducer | None = None,
        *,
        group: str | None = None,
        timeout: float | None = None,
    ) -> ConsumeTransaction:
        if self.auto_commit:
            raise ValueError(
                "a transaction commits this consumer's offsets: create it with auto_commit=False"
            )
        return super().transaction(producer, group=group, timeout=timeout)

    def _offsets_to_commit(self, offsets: Mapping[QueueInfo, int] | None) -> dict[QueueInfo, int]:
        if offsets is not None:
            return dict(offsets)
        return {
            queue: self._positions[key]
            for key, queue in self._assigned.items()
            if key in self._positions and self._committed.get(key) != self._positions[key]
        }

    def _expected_offset(self, queue: QueueInfo) -> int:
        """The group's committed offset this member read from (-1: none was committed)."""
        return self._committed.get(queue_key(queue), -1)

    def _offset_committed(self, queue: QueueInfo, offset: int) -> None:
        self._committed[queue_key(queue)] = offset

    async def _reload_committed(self, queues: list[QueueInfo]) -> None:
        """After a fenced or rolled-back transaction: read again from the committed offsets."""
        for queue in queues:
            key = queue_key(queue)
            if key not in self._assigned:
                continue
            try:
                offset = await self._get_offset(queue)
            except OffsetNotFound:
                self._committed.pop(key, None)
                offset = await self._query_offset(queue, self.consume_from)
            else:
                self._committed[key] = offset
            self._positions[key] = offset

    async def _commit_keys(self, keys: list[str]) -> None:
        for key in keys:
            queue, position = self._assigned.get(key), self._positions.get(key)
            if queue is None or position is None or self._committed.get(key) == position:
                continue
            await self._update_offset(queue, position)
            self._committed[key] = position
        self._last_commit = asyncio.get_running_loop().time()

    async def _maybe_auto_commit(self) -> None:
        if (
            self.auto_commit
            and asyncio.get_running_loop().time() - self._last_commit >= self.auto_commit_interval
        ):
            try:
                await self.commit()
            except ClientError as exc:
                log.info("event=auto_commit_failed group=%s error=%s", self.group, exc)
