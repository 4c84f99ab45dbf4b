"""The controller: appoints a new master when a broker group's master is gone.

One controller acts per cluster at a time: it holds the key
``/halfmoon/<cluster>/controller`` under its member's etcd lease (created
with a compare on ``create_revision == 0``, as any election in halfmoon).
Every broker that is a group member runs one (``halfmoon.broker_node``), so
whichever holds the key acts, and another takes over when it dies: the key
goes with the member's lease, in the same expiry as that member's master key
if it was a master.

Every controller follows the cluster's keys with an etcd watch and looks at
the groups the moment a key under ``broker-groups/`` or the controller key
changes, and every ``CONTROLLER_POLL_S`` (``defaults``) whatever the watch
says. A group whose master key is gone (its lease expired: the master died,
was paused or cut off from etcd) gets a new master:

- the candidates are the live members (member key present) named in the
  group's published in-sync set: those hold every acknowledged write. A live
  member outside the set is chosen only with ``unclean=True`` (Kafka's
  ``unclean.leader.election.enable``; off by default), which can lose
  acknowledged writes;
- among the candidates, the one whose log ends furthest (asked over the
  replication ``Status``) is chosen, so the others are behind it and catch up
  from their own end; a candidate that does not answer is taken last;
- one etcd transaction, compared on the master key being absent and the epoch
  and in-sync keys unchanged since read, writes the master key under the
  *chosen member's* lease and the epoch key bumped by one, and deletes the
  group's routing entry (``brokers/<group>``, which proxies follow): the new
  master writes that itself once it serves (``coordination``). Two
  controllers racing (one about to lose its key) cannot both appoint: the
  second transaction fails.

A **planned switchover** (``cluster failover``: a request in the group's
``switchover`` key, see ``halfmoon.cluster.coordination.switchover``) goes the other way
round: the group has a master, and the controller

- checks the request against the group's keys (the target live, in the
  in-sync set, not the master; none named: the in-sync replica whose log ends
  furthest) and marks it ``running``;
- asks the master to hand over (``Handover``): it fences its store and answers
  once the target holds its whole log, or refuses after ``HANDOVER_TIMEOUT_S``
  and takes writes again;
- appoints the target as above, compared on the master key's revision as read
  before the handover (a master that gave up waiting rewrites its key, so a
  late appointment fails), and answers the request (``done`` or ``failed``
  with a stable code).

The epoch key counts both (``failovers``, ``switchovers``), carried from
epoch to epoch, for the proxies' metrics.

The chosen member sees etcd name it under its own lease (the controller asks
it to look at once, through ``Status``; its follower also asks etcd every
second) and takes office (``GroupRole.promote``): it records the
new epoch at its log's end in its epoch table and opens the broker. The other
replicas' followers see the new master key and follow it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from halfmoon.cluster.coordination.etcd import Compare, EtcdClient, WatchBatch, delete_op, put_op
from halfmoon.cluster.coordination.etcd_json import EtcdRequestError, KeyValue
from halfmoon.cluster.coordination.follow import follow_prefix
from halfmoon.cluster.coordination.keys import ClusterKeys
from halfmoon.cluster.errors import CoordinatorUnavailable
from halfmoon.cluster.internal.internal_tls import InternalTls
from halfmoon.cluster.internal.peer_tls import PLAIN_PEERS, PeerTls
from halfmoon.config import replication_defaults as defaults
from halfmoon.replication import protocol
from halfmoon.replication.coordination import counters
from halfmoon.replication.keys import GroupKeys

log = logging.getLogger("halfmoon.replication.controller")

STATUS_TIMEOUT_S = 1.0
# How long a fenced master waits for the target to catch up, and then for the appointment.
HANDOVER_TIMEOUT_S = 2.0
HANDOVER_HOLD_S = 3.0


@dataclass(frozen=True)
class Candidate:
    member: str
    endpoint: str
    lease: int
    record: dict[str, Any]
    log_end: int = -1  # -1: did not answer


def controller_key(cluster: str) -> str:
    return ClusterKeys(cluster).prefix + "controller"


class Controller:
    """The cluster's controller as run by one group member, holding its key under ``lease()``
    (the member's own lease, renewed by the member: ``coordination``)."""

    def __init__(
        self,
        coordinator: str,
        cluster: str,
        *,
        name: str,
        lease: Callable[[], int],
        unclean: bool = False,
        tls: PeerTls = PLAIN_PEERS,
    ) -> None:
        self.cluster = cluster
        self._tls = tls.internal  # towards the group members, over the replication protocol
        self.name = name
        self.unclean = unclean
        self.active = threading.Event()  # set while this controller holds the key
        self.appointed = 0  # failovers done by this controller
        self.switched = 0  # planned switchovers done by this controller
        self._client = EtcdClient.from_url(coordinator, tls=tls.etcd)
        self._member_lease = lease
        self._held_under = 0  # the lease the key was created under
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="halfmoon-controller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                loop.call_soon_threadsafe(wake.set)
        self._thread.join(10)

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = wake = asyncio.Event()
        watch = asyncio.create_task(self._follow(wake), name="controller watch")
        try:
            while not self._stop.is_set():
                wake.clear()
                try:
                    if await self._hold():
                        await self.check_groups()
                except CoordinatorUnavailable as error:
                    log.warning("event=controller_etcd_unavailable error=%s", error)
                except Exception:
                    log.exception("event=controller_failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), defaults.CONTROLLER_POLL_S)
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            if self.active.is_set():
                with contextlib.suppress(Exception):  # hand over at once
                    await self._client.txn(
                        [Compare(controller_key(self.cluster), "LEASE", self._held_under)],
                        [delete_op(controller_key(self.cluster))],
                    )
            with contextlib.suppress(Exception):
                await self._client.close()

    async def _follow(self, wake: asyncio.Event) -> None:
        """Wake the loop as soon as a group's keys or the controller key change: a master key
        gone (its lease expired) is acted on at once rather than at the next poll."""
        prefix = ClusterKeys(self.cluster).prefix
        watched = (prefix + "broker-groups/", controller_key(self.cluster))

        async def listed(_kvs: list[KeyValue], _revision: int) -> None:
            wake.set()

        async def changed(batch: WatchBatch) -> None:
            if any(e.kv.key.startswith(watched) for e in batch.events):
                wake.set()

        await follow_prefix(
            self._client, prefix, what="controller", listed=listed, changed=changed,
            heartbeat_s=defaults.CONTROLLER_POLL_S * 4,
        )  # fmt: skip

    async def _hold(self) -> bool:
        """Hold (or try to take) the controller key; whether this controller acts now."""
        lease = self._member_lease()
        key = controller_key(self.cluster)
        if self.active.is_set():
            held = await self._client.get(key)
            if held is not None and held.lease == self._held_under == lease:
                return True
            log.warning("event=controller_lease_lost name=%s", self.name)
            self.active.clear()
        if not lease:
            return False
        value = json.dumps(
            {"name": self.name, "host": socket.gethostname(), "pid": os.getpid(),
             "since_ms": int(time.time() * 1000)}
        ).encode()  # fmt: skip
        try:
            created, _ = await self._client.create(key, value, lease=lease)
        except EtcdRequestError as error:  # the member's lease just ended (leaving, rejoining)
            log.info("event=controller_lease_gone name=%s error=%s", self.name, error)
            return False
        if created:
            log.info("event=controller_active name=%s", self.name)
            self._held_under = lease
            self.active.set()
        return created

    async def check_groups(self) -> None:
        prefix = ClusterKeys(self.cluster).prefix + "broker-groups/"
        kvs, _ = await self._client.get_prefix(prefix)
        groups: dict[str, dict[str, KeyValue]] = {}
        for kv in kvs:
            group, _, rest = kv.key[len(prefix) :].partition("/")
            groups.setdefault(group, {})[rest] = kv
        for group, keys in sorted(groups.items()):
            if "master" not in keys and any(k.startswith("members/") for k in keys):
                await self.failover(group, keys)
            elif _json(keys.get("switchover")).get("state") == "requested":
                await self.switchover(group, keys)

    async def failover(self, group: str, keys: dict[str, KeyValue]) -> bool:
        """Appoint a master for ``group`` (its keys as read); whether one was appointed."""
        isr_kv = keys.get("isr")
        isr = set(_json(isr_kv).get("isr", [])) if isr_kv else set()
        live = _live(keys)
        candidates = [c for c in live if c.member in isr]
        if not candidates and self.unclean:
            candidates = live
            log.warning("event=unclean_election group=%s live=%s", group, [c.member for c in live])
        if not candidates:
            log.warning(
                "event=failover_no_candidate group=%s isr=%s live=%s",
                group, sorted(isr), sorted(c.member for c in live),
            )  # fmt: skip
            return False
        answered = await asyncio.gather(
            *(asyncio.to_thread(_log_end, c, self._tls) for c in candidates)
        )
        chosen = max(answered, key=lambda c: (c.log_end, c.member))
        appointed = await self._appoint(
            group, keys, chosen, Compare(GroupKeys(self.cluster, group).master, "CREATE", 0),
            "failovers",
        )  # fmt: skip
        if appointed:
            self.appointed += 1
            log.warning(
                "event=failover group=%s master=%s epoch=%d log_end=%d isr=%s",
                group, chosen.member, appointed, chosen.log_end, sorted(isr),
            )  # fmt: skip
        return appointed > 0

    async def _appoint(
        self,
        group: str,
        keys: dict[str, KeyValue],
        chosen: Candidate,
        master_compare: Compare,
        cause: str,
    ) -> int:
        """Write ``chosen`` as master in the next epoch (see the module); that epoch, or 0
        when the group's keys changed since read."""
        isr_kv, epoch_kv = keys.get("isr"), keys.get("epoch")
        epoch = int(_json(epoch_kv).get("epoch", 0)) + 1 if epoch_kv else 1
        group_keys = GroupKeys(self.cluster, group)
        master_value = json.dumps(
            {"member": chosen.member, "endpoint": chosen.endpoint, "epoch": epoch,
             "instance": chosen.record.get("instance"), "elected_ms": int(time.time() * 1000),
             "appointed_by": self.name}
        ).encode()  # fmt: skip
        epoch_value = json.dumps(
            # start_offset: the chosen log's end as it answered (-1: unknown); the member's
            # epoch table holds the exact one, recorded when it takes office.
            {**counters(epoch_kv, cause), "epoch": epoch, "master": chosen.member,
             "start_offset": chosen.log_end, "cause": cause.removesuffix("s")}
        ).encode()  # fmt: skip
        compares = [
            master_compare,
            Compare(group_keys.epoch, "MOD", epoch_kv.mod_revision if epoch_kv else 0),
        ]
        if cause == "failovers":
            # The in-sync set chose the candidates. A switchover's target holds the fenced
            # master's whole log instead, and the master may republish the set meanwhile.
            compares.append(Compare(group_keys.isr, "MOD", isr_kv.mod_revision if isr_kv else 0))
        result = await self._client.txn(
            compares,
            [
                put_op(group_keys.master, master_value, chosen.lease),
                # The route goes until the new master announces itself, once it serves
                # (``coordination``): proxies never route to a master still opening.
                delete_op(group_keys.route),
                put_op(group_keys.epoch, epoch_value),
            ],
        )
        if not result.succeeded:
            return 0
        # Tell the members now rather than at their followers' next look at etcd: the chosen
        # one takes office, the others follow it (it takes no sync write until one does).
        others = [c for c in _live(keys) if c.member != chosen.member]
        await asyncio.gather(*(asyncio.to_thread(_nudge, c, self._tls) for c in [chosen, *others]))
        return epoch

    async def switchover(self, group: str, keys: dict[str, KeyValue]) -> None:
        """Carry out the group's switchover request and answer it in its key."""
        request_kv = keys["switchover"]
        request = _json(request_kv)
        group_keys = GroupKeys(self.cluster, group)
        running = {**request, "state": "running", "controller": self.name}
        taken = await self._client.txn(
            [Compare(group_keys.switchover, "MOD", request_kv.mod_revision)],
            [put_op(group_keys.switchover, json.dumps(running).encode())],
        )
        if not taken.succeeded:
            return  # withdrawn or replaced meanwhile
        started = time.monotonic()
        try:
            outcome = await self._switch(group, keys, request.get("to"))
        except Exception as error:  # noqa: BLE001 - answer the request whatever happened
            log.exception("event=switchover_failed group=%s", group)
            outcome = {"state": "failed", "code": "SWITCHOVER_FAILED", "message": str(error)}
        outcome["took_ms"] = int((time.monotonic() - started) * 1000)
        outcome["finished_ms"] = int(time.time() * 1000)
        await self._client.txn(
            [Compare(group_keys.switchover, "MOD", taken.revision)],
            [put_op(group_keys.switchover, json.dumps({**running, **outcome}).encode())],
        )

    async def _switch(
        self, group: str, keys: dict[str, KeyValue], to: str | None
    ) -> dict[str, Any]:
        master_kv = keys.get("master")
        master = _json(master_kv)
        if master_kv is None or not master.get("member"):
            return _failed("SWITCHOVER_NO_MASTER", f"group {group} has no master now")
        isr = set(_json(keys.get("isr")).get("isr", []))
        live = _live(keys)
        if to is not None:
            if to == master["member"]:
                return _failed("SWITCHOVER_TARGET_IS_MASTER", f"{to} is the master already")
            if to not in {c.member for c in live}:
                return _failed("SWITCHOVER_TARGET_UNKNOWN", f"{to} is not a live member")
            if to not in isr:
                return _failed(
                    "SWITCHOVER_TARGET_NOT_IN_SYNC",
                    f"{to} is not in the in-sync set ({', '.join(sorted(isr)) or 'empty'})",
                )
        candidates = [
            c for c in live if c.member in isr and c.member != master["member"]
            and (to is None or c.member == to)
        ]  # fmt: skip
        if not candidates:
            return _failed("SWITCHOVER_NO_CANDIDATE", "no live in-sync replica to hand over to")
        answered = await asyncio.gather(
            *(asyncio.to_thread(_log_end, c, self._tls) for c in candidates)
        )
        chosen = max(answered, key=lambda c: (c.log_end, c.member))
        try:
            handed = await asyncio.to_thread(
                _handover,
                str(master.get("endpoint")),
                int(master.get("epoch", 0)),
                chosen.member,
                self._tls,
            )
        except grpc.RpcError as error:
            code, _, message = (error.details() or "").partition(": ")
            if not message:
                code, message = "SWITCHOVER_FAILED", f"the master did not answer: {error.code()}"
            return _failed(code, message)
        assert master_kv is not None
        epoch = await self._appoint(
            group, keys, Candidate(chosen.member, chosen.endpoint, chosen.lease, chosen.record,
                                   int(handed.get("end_offset", chosen.log_end))),
            Compare(GroupKeys(self.cluster, group).master, "MOD", master_kv.mod_revision),
            "switchovers",
        )  # fmt: skip
        if not epoch:
            return _failed(
                "SWITCHOVER_CONFLICT",
                "the group changed while the master handed over; the master takes writes again",
            )
        self.switched += 1
        log.warning(
            "event=switchover group=%s master=%s previous=%s epoch=%d end=%s",
            group, chosen.member, master["member"], epoch, handed.get("end_offset"),
        )  # fmt: skip
        return {
            "state": "done", "master": chosen.member, "previous": master["member"],
            "epoch": epoch, "end_offset": handed.get("end_offset"),
            "fenced_ms": handed.get("fenced_ms"),
        }  # fmt: skip


def _json(kv: KeyValue | None) -> dict[str, Any]:
    if kv is None:
        return {}
    try:
        value = json.loads(kv.value)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _log_end(candidate: Candidate, tls: InternalTls) -> Candidate:
    """The candidate with its log's end, asked over the replication ``Status``."""
    try:
        with tls.channel(candidate.endpoint, []) as channel:
            call = channel.unary_unary(protocol.STATUS)
            answer = protocol.decode(call(protocol.encode({}), timeout=STATUS_TIMEOUT_S))
        return Candidate(
            candidate.member, candidate.endpoint, candidate.lease, candidate.record,
            int(answer.get("end_offset", -1)),
        )  # fmt: skip
    except (grpc.RpcError, ValueError, TypeError):
        return candidate


def _live(keys: dict[str, KeyValue]) -> list[Candidate]:
    """The group's live members that a controller can appoint (their lease published)."""
    live = []
    for key, kv in keys.items():
        if key.startswith("members/"):
            record = _json(kv)
            if record.get("lease") and record.get("endpoint"):
                live.append(Candidate(key[len("members/") :], record["endpoint"], kv.lease, record))
    return live


def _failed(code: str, message: str) -> dict[str, Any]:
    log.warning("event=switchover_refused code=%s message=%s", code, message)
    return {"state": "failed", "code": code, "message": message}


def _handover(endpoint: str, epoch: int, to: str, tls: InternalTls) -> dict[str, Any]:
    """Ask the master to fence itself and wait for ``to`` (``Handover``); its answer."""
    request = {
        "epoch": epoch, "to": to, "timeout_ms": int(HANDOVER_TIMEOUT_S * 1000),
        "hold_ms": int(HANDOVER_HOLD_S * 1000),
    }  # fmt: skip
    with tls.channel(endpoint, []) as channel:
        call = channel.unary_unary(protocol.HANDOVER)
        raw = call(protocol.encode(request), timeout=HANDOVER_TIMEOUT_S + 3)
    return protocol.decode(raw)


def _nudge(candidate: Candidate, tls: InternalTls) -> None:
    """Ask a member to look at etcd now, a master just appointed (it would within a second
    anyway)."""
    with (
        contextlib.suppress(grpc.RpcError, ValueError),
        tls.channel(candidate.endpoint, []) as channel,
    ):
        call = channel.unary_unary(protocol.STATUS)
        call(protocol.encode({"check_appointment": True}), timeout=STATUS_TIMEOUT_S)
