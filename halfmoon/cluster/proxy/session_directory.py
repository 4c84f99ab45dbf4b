"""Which clients are connected to which proxy worker, for every proxy's admin API.

A client's session and telemetry stream live on the one proxy worker its
connection reached, so the admin calls that list connected clients
(``consumer status``, ``producer status``, the client count of ``status``)
would see only the clients of the worker that happens to answer. Each worker
therefore publishes its sessions in etcd, one key per worker
(``/halfmoon-sessions/<cluster>/<proxy>/<pid>``) under a lease of its own, so
a worker that dies takes its entry with it within the lease's time; any
worker answers with its own live sessions plus everyone else's entries. The
entries also say which worker holds a client's stream, where a command for
that client is relayed (:mod:`halfmoon.cluster.proxy.command_relay`).

The entries live beside the cluster's keys, not under them: proxies and
brokers watch the cluster's prefix, and a client connecting should not wake
them. A worker republishes at most once per :data:`PUBLISH_EVERY_S`, when
something other than idle time changed, and at least every
:data:`REFRESH_EVERY_S`; a listing is therefore up to a second behind for
clients of other workers (and exact for the worker's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from typing import Any

from halfmoon.cluster.coordination.etcd import GRPC_NOT_FOUND, EtcdClient
from halfmoon.cluster.coordination.etcd_json import EtcdRequestError
from halfmoon.cluster.coordination.keys import ROOT, check_name
from halfmoon.errors import HalfmoonError
from halfmoon.server.telemetry import ClientRegistry

log = logging.getLogger("halfmoon.cluster")

SESSIONS_ROOT = ROOT.rstrip("/") + "-sessions/"
_ETCD_FAILURES = (HalfmoonError, EtcdRequestError, OSError, TimeoutError)
PUBLISH_EVERY_S = 1.0
REFRESH_EVERY_S = 10.0


def sessions_prefix(cluster: str) -> str:
    return f"{SESSIONS_ROOT}{check_name('cluster', cluster)}/"


class SessionDirectory:
    """This worker's sessions in etcd, and every worker's sessions read back."""

    def __init__(
        self, client: EtcdClient, cluster: str, proxy: str, registry: ClientRegistry, ttl_s: int
    ) -> None:
        self._client = client
        self._registry = registry
        self._ttl_s = ttl_s
        self.prefix = sessions_prefix(cluster)
        self.worker = f"{check_name('proxy', proxy)}/{os.getpid()}"
        self.key = self.prefix + self.worker
        self._lease = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def lease(self) -> int:
        """The lease this worker's entry lives under (a new one after it lapsed; 0 before
        :meth:`start`): the holder of its AMQP deliveries
        (:mod:`halfmoon.cluster.internal.delivery_holders`)."""
        return self._lease

    def local(self) -> list[dict[str, Any]]:
        """This worker's sessions, listed (:meth:`ClientSession.listing`) and marked as its."""
        return [{**s.listing(), "worker": self.worker} for s in self._registry.sessions()]

    async def start(self) -> None:
        self._lease = await self._client.grant_lease(self._ttl_s)
        await self._publish(self.local())
        self._task = asyncio.create_task(self._run(), name="session directory")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._lease:
            with contextlib.suppress(*_ETCD_FAILURES):
                await self._client.revoke_lease(self._lease)  # the entry goes with it

    async def all_sessions(self) -> list[dict[str, Any]]:
        """Every worker's sessions: this worker's as they are now, the others' as last
        published (an unreachable etcd leaves only this worker's, logged)."""
        own = self.local()
        seen = {s["client_id"] for s in own}
        try:
            published = await self._published()
        except _ETCD_FAILURES as error:
            log.warning("event=session_directory_unreadable error=%s", error)
            return own
        others: list[dict[str, Any]] = []
        for session in published:
            if session.get("client_id") not in seen:
                seen.add(session.get("client_id"))
                others.append(session)
        return own + others

    async def elsewhere(self, client_id: str) -> list[dict[str, Any]]:
        """The sessions other workers published for ``client_id`` (a client given several
        endpoints may hold one on each), each with its ``worker``; etcd errors raise."""
        return [s for s in await self._published() if s.get("client_id") == client_id]

    async def _published(self) -> list[dict[str, Any]]:
        """Every other worker's published sessions, in key order (unreadable entries skipped)."""
        entries, _revision = await self._client.get_prefix(self.prefix)
        sessions: list[dict[str, Any]] = []
        for kv in entries:
            if kv.key == self.key:
                continue
            try:
                published = json.loads(kv.value)
            except ValueError:
                continue
            for session in published if isinstance(published, list) else ():
                if isinstance(session, dict):
                    sessions.append(session)
        return sessions

    async def _publish(self, sessions: list[dict[str, Any]]) -> None:
        value = json.dumps(sessions, sort_keys=True).encode()
        await self._client.put(self.key, value, lease=self._lease)

    async def _run(self) -> None:
        published: list[dict[str, Any]] | None = None
        published_at = renewed_at = time.monotonic()
        while True:
            await asyncio.sleep(PUBLISH_EVERY_S)
            now = time.monotonic()
            try:
                if now - renewed_at >= self._ttl_s / 3:
                    if not await self._client.keep_alive(self._lease):
                        raise EtcdRequestError(
                            "the session directory's lease expired", grpc_code=GRPC_NOT_FOUND
                        )
                    renewed_at = now
                sessions = self.local()
                if _without_idle(sessions) != published or now - published_at >= REFRESH_EVERY_S:
                    await self._publish(sessions)
                    published, published_at = _without_idle(sessions), now
            except _ETCD_FAILURES as error:
                # etcd away, or the lease lapsed meanwhile: a new lease, published next round.
                log.warning("event=session_directory_failed error=%s", error)
                published = None
                with contextlib.suppress(*_ETCD_FAILURES):
                    self._lease = await self._client.grant_lease(self._ttl_s)
                    renewed_at = time.monotonic()


def _without_idle(sessions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in s.items() if k != "idle_seconds"} for s in sessions]
