"""What an AMQP queue does with nobody asking: expire its head, delete itself when unused.

Once every ``SWEEP_INTERVAL_S`` (1 s) the sweep walks every queue of every vhost:

- ``x-expires`` (ms): a queue unused that long is deleted, as by Queue.Delete
  (its consumers, if any came meanwhile, are cancelled). Used means: a
  consumer attached, or a Basic.Get or a (not passive) declare of it; the
  clock restarts with the server, as RabbitMQ's does.
- In cluster mode a queue's use and consumers are the whole cluster's
  (:mod:`halfmoon.amqp.cluster_consumers`): a queue without a consumer on
  this worker that the cluster's record shows unused past its x-expires, or
  auto-delete and left by its last consumer (a dead worker's consumers end
  with its lease), is deleted by the one worker etcd lets claim it. An
  exclusive queue is its connection's alone: the worker holding that
  connection decides on its own clock, the others leave it be. What a
  deletion cut short left in that record is cleared too.
- Expiry at the head: on a queue with ``x-message-ttl`` or a dead-letter
  exchange, the expired messages at the head of each of its queues (up to
  ``SWEEP_BATCH`` a sweep) are taken and dead-lettered (reason
  ``expired``) or dropped, so a TTL queue without consumers still moves its
  messages to the dead-letter exchange on time, and its message count falls
  as they expire (RabbitMQ expires at the head too). A queue with deliveries
  in flight is left to its consumers, which dead-letter an expired message
  when they reach it (the head is then not the next message a take returns).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from halfmoon.amqp.dead_letter import EXPIRED, has_dead_letter_exchange
from halfmoon.amqp.message import expired
from halfmoon.amqp.topology import Queue, VHost

if TYPE_CHECKING:
    from halfmoon.amqp.server import AmqpServer

log = logging.getLogger("halfmoon.amqp")

SWEEP_INTERVAL_S = 1.0
SWEEP_BATCH = 256
CLIENT_ID = "amqp-housekeeping"


def expires_ms(queue: Queue) -> int | None:
    value = queue.arguments.get("x-expires")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Housekeeping:
    def __init__(self, server: AmqpServer) -> None:
        self._server = server
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                await self.sweep()
            except Exception:  # noqa: BLE001 - one bad sweep must not end the next ones
                log.exception("event=amqp_housekeeping_failed")

    async def sweep(self) -> None:
        for vhost in list(self._server.topology.vhosts.values()):
            for queue in list(vhost.queues.values()):
                if vhost.queues.get(queue.name) is not queue:
                    continue  # deleted during this sweep
                if await self._unused(queue):
                    await self._server.delete_queue(vhost, queue)
                    continue
                if "x-message-ttl" in queue.arguments or has_dead_letter_exchange(queue):
                    await self._expire_head(vhost, queue)
        cluster = self._server.cluster_consumers
        if cluster is not None:
            known = {
                q.stored for v in self._server.topology.vhosts.values() for q in v.queues.values()
            }
            await cluster.clear_leftovers(known.__contains__)

    async def _unused(self, queue: Queue) -> bool:
        """Whether the queue goes now, unused (and whether this server is the one to go)."""
        if self._server.consumers_of(queue):
            return False
        cluster = self._server.cluster_of(queue)
        if cluster is not None:
            why = cluster.due(queue)
            if why is None or not await self._server.may_delete(queue, why):
                return False
            log.info("event=amqp_queue_unused queue=%s reason=%s", queue.stored, why.value)
            return True
        # Shared by several servers without a cluster's record of its use, a queue's use is
        # known only to the server that saw it: none may expire it on its own say-so, but
        # the server of the one connection an exclusive queue serves.
        if self._server.topology.shared and not self._server.owns(queue):
            return False
        limit = expires_ms(queue)
        if limit is None or (time.monotonic() - queue.last_used) * 1000 < limit:
            return False
        log.info("event=amqp_queue_expired queue=%s", queue.stored)
        return True

    async def _expire_head(self, vhost: VHost, queue: Queue) -> None:
        queues = self._server.queues
        now = int(time.time() * 1000)
        heads = await queues.expired_at_head(queue.stored, now, SWEEP_BATCH)
        for queue_id, count in heads.items():
            views, _ = await queues.receive(queue.stored, count, CLIENT_ID, queue_id)
            gone = [v for v in views if expired(v, now)]
            back = [v.receipt_handle or "" for v in views if not expired(v, now)]
            if back:  # a publish or a consumer raced the sweep: not ours to expire
                await queues.requeue(queue.stored, back)
            await self._server.dead_letters.move(vhost, [(queue, v) for v in gone], EXPIRED, now)
