"""Which proxy worker's consumer of an ``x-single-active-consumer`` queue is the active one.

Consumers live in the proxy worker their connection reached, so each worker
alone would pick an active consumer of its own. The workers agree through
etcd instead: a worker whose consumers of such a queue want to deliver
claims the queue's key (``/halfmoon-amqp-active/<cluster>/<queue>``, created
only if absent, under the worker's session-directory lease), and only the
worker holding it lets its first consumer deliver. It lets the key go when
its last consumer of the queue goes (or with its lease, when it dies or is
cut off from etcd past its TTL); another worker's claim, tried every
:data:`CLAIM_EVERY_S` while it wants one, then takes it over. The keys live
beside the cluster's, not under them: proxies and brokers watch the
cluster's prefix, and a consumer starting should not wake them.

With etcd unreachable nothing changes hands: the holder keeps delivering
(its key is gone only once its lease is), the others keep waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from urllib.parse import quote

from halfmoon.cluster.coordination.etcd import Compare, EtcdClient, delete_op
from halfmoon.cluster.coordination.etcd_json import EtcdRequestError
from halfmoon.cluster.coordination.keys import ROOT, check_name
from halfmoon.errors import HalfmoonError

log = logging.getLogger("halfmoon.cluster")

ACTIVE_ROOT = ROOT.rstrip("/") + "-amqp-active/"
CLAIM_EVERY_S = 0.5
_ETCD_FAILURES = (HalfmoonError, EtcdRequestError, OSError, TimeoutError)


class EtcdActiveClaims:
    """This worker's claims on single-active-consumer queues (``AmqpServer``'s
    ``active_claims``): :meth:`want` says which it wants, :meth:`holds` which it has."""

    def __init__(
        self,
        client: EtcdClient,
        cluster: str,
        worker: str,
        lease: Callable[[], int],
        *,
        every_s: float = CLAIM_EVERY_S,
    ) -> None:
        self._client = client
        self._prefix = f"{ACTIVE_ROOT}{check_name('cluster', cluster)}/"
        self._me = worker.encode()
        self._lease = lease
        self._every_s = every_s
        self._wanted: set[str] = set()
        self._held: set[str] = set()
        self._letting_go: set[str] = set()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.on_change: Callable[[], None] = lambda: None  # a claim was won (wake consumers)

    def holds(self, stored: str) -> bool:
        return stored in self._held

    def want(self, stored: str, wanted: bool) -> None:
        """Claim ``stored`` (its consumers here want to deliver), or let it go at once."""
        if wanted:
            self._wanted.add(stored)
            self._letting_go.discard(stored)
        else:
            self._wanted.discard(stored)
            if stored in self._held:
                self._held.discard(stored)  # no delivery from here from now on
                self._letting_go.add(stored)
        self._changed.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="amqp active consumers")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._letting_go |= self._held
        self._held.clear()
        with contextlib.suppress(*_ETCD_FAILURES):
            await self._let_go()

    def _key(self, stored: str) -> str:
        return self._prefix + quote(stored, safe="")

    async def _run(self) -> None:
        while True:
            try:
                await self._let_go()
                if await self._claim():
                    self.on_change()
            except _ETCD_FAILURES as error:
                log.warning("event=amqp_active_claims_failed error=%s", error)
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._every_s):
                    await self._changed.wait()

    async def _claim(self) -> bool:
        """Try each wanted queue's key; whether a claim was won."""
        won = False
        for stored in sorted(self._wanted):
            created, kv = await self._client.create(
                self._key(stored), self._me, lease=self._lease()
            )
            mine = created or kv.value == self._me
            if stored not in self._wanted:
                continue  # let go meanwhile
            if mine and stored not in self._held:
                self._held.add(stored)
                won = True
            elif not mine:
                self._held.discard(stored)
        return won

    async def _let_go(self) -> None:
        for stored in sorted(self._letting_go):
            key = self._key(stored)
            # Deleted only while it is this worker's: another may have claimed it since.
            await self._client.txn([Compare(key, "VALUE", self._me)], [delete_op(key)])
            self._letting_go.discard(stored)
