"""Membership: a broker or proxy registers under an etcd lease and keeps the lease alive.

The member's key (``/halfmoon/<cluster>/brokers/<name>`` or ``.../proxies/<id>``)
holds its endpoint and facts and is attached to a lease of ``ttl_s`` seconds.
A background task renews the lease every ``ttl_s / 3`` seconds. When the
process dies the renewals stop and etcd deletes the key when the lease
expires: etcd decides who is alive, halfmoon only reads its answer.

- **Clean stop**: :meth:`Membership.stop` revokes the lease, which deletes the
  key at once.
- **Restart**: a member registering again at the endpoint its key already
  names (its previous life, crashed before its lease expired) takes the key
  over under a new lease and revokes the old one, so no stale entry or lease
  remains. A key naming a *different* endpoint under a live lease is another
  process with the same name: :class:`MemberNameTaken`.
- **Lost lease** (etcd unreachable for longer than the TTL, or the process
  paused): the next renewal finds the lease gone and registers afresh.
- **etcd unreachable**: renewals are retried at the same interval; the member
  keeps working and reports ``registered`` false until etcd answers.

Facts that change (a broker's free disk) come from ``facts_source``, read at
registration and republished every ``facts_every_s`` seconds (30) under the
same lease; a failing source is logged and the last facts stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from halfmoon.cluster.coordination.etcd import Compare, EtcdClient, put_op
from halfmoon.cluster.coordination.keys import ClusterKeys
from halfmoon.cluster.errors import CoordinatorUnavailable, MemberNameTaken
from halfmoon.config.cluster import DEFAULT_TTL_S, MIN_TTL_S
from halfmoon.process_start import process_started_ms

log = logging.getLogger("halfmoon.cluster.coordination.membership")

ROLES = {"broker": "brokers", "proxy": "proxies"}
FACTS_EVERY_S = 30.0
REGISTER_ATTEMPTS = 3  # reads and writes: a key moved by an expiring lease needs one more


class Membership:
    def __init__(
        self,
        client: EtcdClient,
        cluster: str,
        role: str,
        name: str,
        endpoint: str,
        facts: dict[str, Any] | None = None,
        *,
        ttl_s: int = DEFAULT_TTL_S,
        facts_source: Callable[[], dict[str, Any]] | None = None,
        facts_every_s: float = FACTS_EVERY_S,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {sorted(ROLES)}, not {role!r}")
        if ttl_s < MIN_TTL_S:
            raise ValueError(f"etcd grants leases of at least {MIN_TTL_S} s")
        keys = ClusterKeys(cluster)
        self.client = client
        self.role = role
        self.name = name
        self.key = keys.broker(name) if role == "broker" else keys.proxy(name)
        self.endpoint = endpoint
        self.facts = dict(facts or {})
        self.facts_source = facts_source
        self.facts_every_s = facts_every_s
        self._facts_read_at = 0.0
        self.ttl_s = ttl_s
        self.instance = uuid.uuid4().hex  # tells this process's entry from a predecessor's
        self.lease = 0
        self.registered = False
        self._stopping = asyncio.Event()
        self._renewer: asyncio.Task[None] | None = None

    def record(self) -> dict[str, Any]:
        return {
            **self.facts,
            "name": self.name,
            "role": self.role,
            "endpoint": self.endpoint,
            "instance": self.instance,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "registered_ms": int(time.time() * 1000),
            "started_ms": process_started_ms(),  # UPTIME: the record is rewritten every 30 s
            "ttl_s": self.ttl_s,
        }

    async def start(self) -> None:
        """Register (raising if etcd is unreachable or the name is taken), then keep it alive."""
        await self._register()
        self._renewer = asyncio.create_task(self._renew_forever(), name=f"lease {self.key}")

    async def update(self, **facts: Any) -> None:
        """Change the facts published with the entry (under the same lease)."""
        self.facts.update(facts)
        if self.registered:
            await self.client.put(self.key, json.dumps(self.record()).encode(), lease=self.lease)

    async def stop(self) -> None:
        """Deregister at once (revoke the lease); the entry stays until its TTL if etcd is down."""
        self._stopping.set()
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None
        if self.lease:
            try:
                await self.client.revoke_lease(self.lease)
            except CoordinatorUnavailable as error:
                log.warning("event=deregister_failed key=%s error=%s", self.key, error)
        self.registered = False
        self.lease = 0

    def _read_facts(self) -> bool:
        """Refresh the facts from ``facts_source`` if they are due; whether they were."""
        if self.facts_source is None:
            return False
        now = time.monotonic()
        if self._facts_read_at and now - self._facts_read_at < self.facts_every_s:
            return False
        self._facts_read_at = now
        try:
            self.facts.update(self.facts_source())
        except Exception:
            log.exception("event=member_facts_failed key=%s", self.key)
            return False
        return True

    async def _register(self) -> None:
        self._read_facts()
        # A predecessor's lease can expire between the read and the write (a restart right
        # after a crash), which moves the key under us: read again and retry. Only a key
        # naming another endpoint under a live lease is another process.
        for _ in range(REGISTER_ATTEMPTS):
            if await self._try_register():
                return
        raise MemberNameTaken(
            f"{self.role} {self.name!r} was registered by another process just now"
        )

    async def _try_register(self) -> bool:
        """One read-compare-write; False when the key changed between the read and the write."""
        existing = await self.client.get(self.key)
        if existing is not None and existing.lease:
            try:
                previous = existing.json()
            except ValueError:
                previous = {}
            if (
                previous.get("endpoint") != self.endpoint
                and previous.get("instance") != self.instance
            ):
                raise MemberNameTaken(
                    f"{self.role} {self.name!r} is registered by another live process at "
                    f"{previous.get('endpoint')!r} (pid {previous.get('pid')} on "
                    f"{previous.get('host')}); stop it or pick another name"
                )
        lease = await self.client.grant_lease(self.ttl_s)
        value = json.dumps(self.record()).encode()
        # Compare the entry read above, so a concurrent registration is not overwritten.
        expected = existing.mod_revision if existing is not None else 0
        result = await self.client.txn(
            [Compare(self.key, "MOD", expected)], [put_op(self.key, value, lease)]
        )
        if not result.succeeded:
            await self.client.revoke_lease(lease)
            return False
        if existing is not None and existing.lease and existing.lease != lease:
            # Our predecessor's lease: revoking it deletes nothing of ours (the key moved to
            # the new lease) and leaves no lease behind to expire later.
            await self.client.revoke_lease(existing.lease)
        self.lease = lease
        self.registered = True
        log.info("event=registered key=%s lease=%x ttl_s=%d", self.key, lease, self.ttl_s)
        return True

    async def _renew_forever(self) -> None:
        interval = self.ttl_s / 3
        while not self._stopping.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)
                return
            try:
                if await self.client.keep_alive(self.lease) > 0:
                    self.registered = True
                    if self._read_facts():
                        await self.client.put(
                            self.key, json.dumps(self.record()).encode(), lease=self.lease
                        )
                    continue
                log.warning("event=lease_lost key=%s lease=%x", self.key, self.lease)
                self.registered = False
                await self._register()
            except CoordinatorUnavailable as error:
                self.registered = False
                log.warning("event=lease_renewal_failed key=%s error=%s", self.key, error)
            except MemberNameTaken as error:
                # Someone took the name while our lease was gone: keep trying, loudly.
                self.registered = False
                log.error("event=member_name_taken key=%s error=%s", self.key, error)
