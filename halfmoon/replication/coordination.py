"""A broker group member's dealings with etcd: its lease, the election, the in-sync set.

Runs its own event loop in a daemon thread (as ``registration`` does), so a
busy broker cannot let its lease lapse; the methods are blocking calls for
the broker's threads.

- :meth:`GroupMember.join` grants the member's lease and writes its member key.
- :meth:`GroupMember.campaign`: one transaction, Compare-And-Swap. It succeeds
  when the master key is absent (``create_revision == 0``) and the epoch key
  is as read; it then writes the master key under this member's lease and
  the epoch key, bumped by one, with no lease. Of two members campaigning at once exactly one wins;
  the epoch is bumped on every change of master and never goes back. A member
  finding the master key naming itself under another lease (its previous
  life, restarted before the lease expired) takes it over in the same way,
  comparing the key's modification revision instead, and bumps the epoch too.
- Every ``FACTS_EVERY_S`` the member rewrites its member key, and a master its
  routing entry (compared against its master key's revision), with fresh facts
  (``facts_source``: the disk figures ``cluster list`` shows).
- :meth:`GroupMember.announce`: once the master serves its broker (the
  internal service registered, the port listening), it writes the group's
  routing entry (``brokers/<group>``, which proxies follow) under its lease,
  compared against the master key's revision it holds. Proxies therefore
  never hear of a master before it can answer them: a master elected or
  appointed but still opening its broker is not routed to yet.
- :meth:`GroupMember.publish_isr` writes the in-sync set, compared against the
  master key's revision this member wrote: a member that is no longer master
  cannot write it.
- The lease is renewed every ``KEEPALIVE_INTERVAL_S`` (``defaults``). A
  master whose lease is found gone is deposed (``on_deposed``): it must
  acknowledge nothing more. So is a master that could not renew for TTL -
  interval (etcd unreachable: partitioned, or paused itself): its lease may
  be gone by the next renewal, so it stops
  before a controller can appoint another master. It does not
  campaign again by itself: the controller of the next step decides. Once
  back in touch with etcd (its key given up, a new lease taken) it is told
  so (``on_demoted``): the broker then starts over as a replica, cutting its
  unreplicated tail.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from halfmoon.cluster.coordination.etcd import Compare, EtcdClient, delete_op, put_op
from halfmoon.cluster.coordination.etcd_json import KeyValue
from halfmoon.cluster.coordination.etcd_tls import PLAIN, EtcdTls
from halfmoon.cluster.coordination.membership import FACTS_EVERY_S
from halfmoon.cluster.errors import CoordinatorUnavailable
from halfmoon.config import replication_defaults as defaults
from halfmoon.process_start import process_started_ms
from halfmoon.replication.keys import GroupKeys

log = logging.getLogger("halfmoon.replication")

CALL_TIMEOUT_S = 30.0
T = TypeVar("T")


@dataclass(frozen=True)
class MasterRecord:
    member: str
    endpoint: str
    epoch: int

    @classmethod
    def parse(cls, value: bytes) -> MasterRecord | None:
        try:
            data = json.loads(value)
            return cls(str(data["member"]), str(data["endpoint"]), int(data["epoch"]))
        except (ValueError, KeyError, TypeError):
            return None


class GroupMember:
    def __init__(
        self,
        coordinator: str,
        cluster: str,
        group: str,
        member: str,
        endpoint: str,
        *,
        ttl_s: int,
        facts: dict[str, Any] | None = None,
        facts_source: Callable[[], dict[str, Any]] | None = None,
        tls: EtcdTls = PLAIN,
    ) -> None:
        self.keys = GroupKeys(cluster, group)
        self.facts_source = facts_source
        self.group = group
        self.member = member
        self.endpoint = endpoint
        self.ttl_s = ttl_s
        self.facts = dict(facts or {})
        self.instance = uuid.uuid4().hex
        self.lease = 0
        self.master_revision = 0  # mod revision of the master key this member wrote
        self.on_deposed: Callable[[], None] | None = None
        self.on_demoted: Callable[[], None] | None = None  # deposed, then back in etcd
        self._deposed = False
        self._client = EtcdClient.from_url(coordinator, tls=tls)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"halfmoon-group-{member}", daemon=True
        )
        self._thread.start()
        self._stopping = asyncio.Event()
        self._renewer: concurrent.futures.Future[None] | None = None

    def _run(self, coroutine: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT_S) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def record(self, **extra: Any) -> bytes:
        return json.dumps(
            {
                **self.facts,
                **self._current_facts(),
                "name": self.member,
                "group": self.group,
                "endpoint": self.endpoint,
                "instance": self.instance,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "registered_ms": int(time.time() * 1000),
                "started_ms": process_started_ms(),
                "ttl_s": self.ttl_s,
                **extra,
            }
        ).encode()

    def _current_facts(self) -> dict[str, Any]:
        if self.facts_source is None:
            return {}
        try:
            return self.facts_source()
        except Exception:
            log.exception("event=member_facts_failed group=%s member=%s", self.group, self.member)
            return {}

    async def _republish_facts(self) -> None:
        """The member key, and a master's routing entry, rewritten with fresh facts."""
        await self._client.put(
            self.keys.member(self.member),
            self.record(role="member", lease=self.lease),
            lease=self.lease,
        )
        if not self.master_revision:
            return
        route = await self._client.get(self.keys.route)
        if route is None:
            return
        try:
            shown = json.loads(route.value)
        except ValueError:
            return
        if not isinstance(shown, dict) or shown.get("member") != self.member:
            return
        value = json.dumps({**shown, **self._current_facts()}).encode()
        await self._client.txn(
            [
                Compare(self.keys.master, "MOD", self.master_revision),
                Compare(self.keys.route, "MOD", route.mod_revision),
            ],
            [put_op(self.keys.route, value, route.lease)],
        )

    # -- membership ------------------------------------------------------------------------

    def join(self) -> None:
        self._run(self._join())
        self._renewer = asyncio.run_coroutine_threadsafe(self._renew_forever(), self._loop)

    async def _join(self) -> None:
        self.lease = await self._client.grant_lease(self.ttl_s)
        await self._client.put(
            # The lease is published so a controller can appoint this member master under it.
            self.keys.member(self.member), self.record(role="member", lease=self.lease),
            lease=self.lease,
        )  # fmt: skip

    def leave(self) -> None:
        """Revoke the lease (deleting the member key and, on a master, the master key)."""
        try:
            if self._renewer is not None:
                self._loop.call_soon_threadsafe(self._stopping.set)
                with contextlib.suppress(Exception):
                    self._renewer.result(5)
            if self.lease:
                with contextlib.suppress(Exception):
                    self._run(self._client.revoke_lease(self.lease), 5)
        finally:
            with contextlib.suppress(Exception):
                self._run(self._client.close(), 5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    async def _renew_forever(self) -> None:
        interval = min(defaults.KEEPALIVE_INTERVAL_S, self.ttl_s / 3)
        # When the last renewal that succeeded was sent: etcd's lease lives at least TTL from
        # then, and perhaps not a moment longer. A master cut off from etcd deposes itself a
        # renewal interval before that, without an answer from etcd, so it has stopped
        # acknowledging before the lease can expire and a controller appoint another master.
        renewed_at = facts_at = time.monotonic()
        deposed_unrenewed = False
        while not self._stopping.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)
                return
            sent_at = time.monotonic()
            try:
                alive = await asyncio.wait_for(self._client.keep_alive(self.lease), interval)
            except (TimeoutError, CoordinatorUnavailable) as error:
                log.warning("event=group_lease_renewal_failed error=%r", error)
                if time.monotonic() - renewed_at >= self.ttl_s - interval:
                    deposed_unrenewed = self._depose("unrenewed") or deposed_unrenewed
                continue
            if alive > 0 and deposed_unrenewed:
                # Back in touch after deposing itself: its key still names a master that
                # acknowledges nothing. Give the key up (revoking the lease) so a controller
                # appoints another, and stay on as a plain member.
                deposed_unrenewed = False
                with contextlib.suppress(CoordinatorUnavailable):
                    await self._client.revoke_lease(self.lease)
                    await self._join()
                    self._demoted()
                renewed_at = time.monotonic()
                continue
            if alive > 0:
                renewed_at = sent_at
                if time.monotonic() - facts_at >= FACTS_EVERY_S and self.facts_source:
                    facts_at = time.monotonic()
                    try:
                        await self._republish_facts()
                    except Exception as error:  # noqa: BLE001 - the renewals must go on
                        log.warning("event=group_facts_failed error=%r", error)
                continue
            log.error("event=group_lease_lost group=%s member=%s", self.group, self.member)
            self._depose("expired")
            with contextlib.suppress(CoordinatorUnavailable):
                await self._join()  # back as a plain member; a controller decides the rest
                renewed_at = time.monotonic()
                self._demoted()

    def _depose(self, reason: str) -> bool:
        """Depose this member if it is master; whether it was."""
        if self.master_revision and self.on_deposed is not None:
            log.error(
                "event=master_deposed group=%s member=%s reason=%s",
                self.group, self.member, reason,
            )  # fmt: skip
            self.master_revision = 0
            self._deposed = True
            self.on_deposed()
            return True
        return False

    def _demoted(self) -> None:
        """A deposed master is a plain member again (in etcd): say so, once."""
        if self._deposed and self.on_demoted is not None:
            self._deposed = False
            log.warning("event=master_demoted group=%s member=%s", self.group, self.member)
            self.on_demoted()

    # -- the election ----------------------------------------------------------------------

    def master(self) -> MasterRecord | None:
        return self._run(self._master())

    async def _master(self) -> MasterRecord | None:
        found = await self._client.get(self.keys.master)
        return MasterRecord.parse(found.value) if found is not None else None

    def appointment(self) -> MasterRecord | None:
        """The master record if etcd names this member under its current lease (a controller
        appointed it, ``controller``); it may then publish the in-sync set as master."""
        return self._run(self._appointment())

    async def _appointment(self) -> MasterRecord | None:
        found = await self._client.get(self.keys.master)
        if found is None or not self.lease or found.lease != self.lease:
            return None
        record = MasterRecord.parse(found.value)
        if record is None or record.member != self.member:
            return None
        self.master_revision = found.mod_revision
        return record

    def may_campaign(self, known_epoch: int) -> bool:
        """Whether this member may campaign at start, knowing ``known_epoch`` (its epoch
        table's newest): a new group (no epoch yet), or a member whose log knows the group's
        current epoch and that the published in-sync set names (or that was its master).
        Anyone else waits for a controller: a member restarted with an empty or stale log
        must not take office over replicas holding acknowledged writes."""
        return self._run(self._may_campaign(known_epoch))

    async def _may_campaign(self, known_epoch: int) -> bool:
        epoch = await self._epoch()
        if epoch == 0:
            return True
        if known_epoch != epoch:
            return False
        found = await self._client.get(self.keys.isr)
        if found is None:
            return True
        try:
            published = json.loads(found.value)
            return self.member == published.get("master") or self.member in published["isr"]
        except (ValueError, KeyError, TypeError):
            return False

    def epoch(self) -> int:
        return self._run(self._epoch())

    async def _epoch(self) -> int:
        found = await self._client.get(self.keys.epoch)
        if found is None:
            return 0
        try:
            return int(json.loads(found.value)["epoch"])
        except (ValueError, KeyError, TypeError):
            return 0

    def campaign(self, log_end: int) -> MasterRecord | None:
        """Try to become master (see the module); the record written, None when another holds
        the key. ``log_end`` is stored with the epoch (where this master's writes begin)."""
        return self._run(self._campaign(log_end))

    async def _campaign(self, log_end: int) -> MasterRecord | None:
        keys = self.keys
        for _ in range(5):  # lost races on the epoch key only: read again
            current = await self._client.get(keys.master)
            previous_lease = 0
            if current is None:
                master_compare = Compare(keys.master, "CREATE", 0)
            else:
                holder = MasterRecord.parse(current.value)
                if holder is None or holder.member != self.member or current.lease == self.lease:
                    return None
                master_compare = Compare(keys.master, "MOD", current.mod_revision)
                previous_lease = current.lease
            epoch_kv = await self._client.get(keys.epoch)
            epoch_compare = Compare(keys.epoch, "MOD", epoch_kv.mod_revision if epoch_kv else 0)
            epoch = await self._epoch() + 1
            record = MasterRecord(self.member, self.endpoint, epoch)
            master_value = json.dumps(
                {"member": self.member, "endpoint": self.endpoint, "epoch": epoch,
                 "instance": self.instance, "elected_ms": int(time.time() * 1000)}
            ).encode()  # fmt: skip
            epoch_value = json.dumps(
                {**counters(epoch_kv), "epoch": epoch, "master": self.member,
                 "start_offset": log_end, "cause": "election"}
            ).encode()  # fmt: skip
            result = await self._client.txn(
                [master_compare, epoch_compare],
                [
                    put_op(keys.master, master_value, self.lease),
                    # A route of the member's previous life (a restart within its lease)
                    # goes: proxies hear of this master when it announces itself.
                    delete_op(keys.route),
                    put_op(keys.epoch, epoch_value),
                ],
            )
            if result.succeeded:
                self.master_revision = result.revision
                if previous_lease:
                    with contextlib.suppress(CoordinatorUnavailable):
                        await self._client.revoke_lease(previous_lease)
                log.info(
                    "event=elected group=%s member=%s epoch=%d", self.group, self.member, epoch
                )
                return record
        return None

    def announce(self, epoch: int, **extra: Any) -> bool:
        """Write the group's routing entry naming this master of ``epoch`` (once it serves),
        if the master key is still the one it holds; whether it was written."""
        return self._run(self._announce(epoch, extra), 5)

    async def _announce(self, epoch: int, extra: dict[str, Any]) -> bool:
        if not self.master_revision:
            return False
        route = self.record(
            role="broker", name=self.group, member=self.member, epoch=epoch, **extra
        )
        result = await self._client.txn(
            [Compare(self.keys.master, "MOD", self.master_revision)],
            [put_op(self.keys.route, route, self.lease)],
        )
        if result.succeeded:
            log.info(
                "event=master_announced group=%s member=%s epoch=%d",
                self.group, self.member, epoch,
            )  # fmt: skip
        return result.succeeded

    def reassert(self) -> bool:
        """Rewrite this master's key unchanged, if it is still the one this member wrote: its
        revision moves, so an appointment read before (a switchover that did not finish in
        time) can no longer be written. Whether this member is still master."""
        return self._run(self._reassert(), 5)

    async def _reassert(self) -> bool:
        if not self.master_revision:
            return False
        current = await self._client.get(self.keys.master)
        if current is None or current.mod_revision != self.master_revision:
            return False
        result = await self._client.txn(
            [Compare(self.keys.master, "MOD", self.master_revision)],
            [put_op(self.keys.master, current.value, self.lease)],
        )
        if result.succeeded:
            self.master_revision = result.revision
        return result.succeeded

    def publish_isr(self, isr: list[str], epoch: int, extra: dict[str, Any]) -> bool:
        """Write the in-sync set if this member still holds the master key it wrote."""
        return self._run(self._publish_isr(isr, epoch, extra), 5)

    async def _publish_isr(self, isr: list[str], epoch: int, extra: dict[str, Any]) -> bool:
        if not self.master_revision:
            return False
        value = json.dumps(
            {"epoch": epoch, "master": self.member, "isr": isr,
             "updated_ms": int(time.time() * 1000), **extra}
        ).encode()  # fmt: skip
        result = await self._client.txn(
            [Compare(self.keys.master, "MOD", self.master_revision)],
            [put_op(self.keys.isr, value)],
        )
        return result.succeeded


# Changes of master counted in the epoch key, carried from one epoch to the next: the key lives
# forever, so the counts survive every master and controller (the proxies' metrics read them).
COUNTERS = ("failovers", "switchovers")


def counters(epoch_kv: KeyValue | None, bump: str | None = None) -> dict[str, int]:
    """The counts the epoch key ``epoch_kv`` holds, ``bump`` incremented."""
    found: dict[str, Any] = {}
    if epoch_kv is not None:
        with contextlib.suppress(ValueError):
            value = json.loads(epoch_kv.value)
            found = value if isinstance(value, dict) else {}
    counts = {}
    for name in COUNTERS:
        try:
            counts[name] = int(found.get(name, 0))
        except (TypeError, ValueError):
            counts[name] = 0
    if bump is not None:
        counts[bump] += 1
    return counts
