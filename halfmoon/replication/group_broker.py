"""The role of a ``halfmoon broker --group G`` process: master or replica, decided in etcd.

:meth:`GroupRole.decide` joins the group (member key under the member's
lease) and campaigns once (``coordination``): the winner is the master, with
the epoch bumped, its epoch table extended at its log's end, a
:class:`ReplicationLeader` serving ``Stream`` and a :class:`ReplicatedStore`
for its broker; any other member is a replica, following whichever member the
master key names (:class:`Follower`), with no broker of its own: a replica
serves the replication service only (``Status``), never proxies.
A replica does not campaign again when its master goes: the controller
(``controller``) appoints one of the in-sync replicas by writing the master key
under that replica's lease; the replica notices when the controller asks it to look
(or its follower next asks etcd for the master, every second), sets
:attr:`GroupRole.promoted`, and the broker process calls
:meth:`GroupRole.promote` to take office and open its broker over the
replicated store. Once that broker serves, :meth:`GroupRole.announce` writes
the group's routing entry, which proxies follow: a master, elected or
appointed, is announced only when it can answer.

A planned switchover (``Handover``, asked by a controller) fences the master's
store, waits for the target replica to hold the whole log and answers; the
master then watches etcd: once another member is named it steps down
(:attr:`GroupRole.demoted`: the broker process closes its broker and rejoins
the group as a replica, following the new master from its log's end, which is
the new master's start); if nobody is named within the hold time it rewrites
its own key (so a late appointment fails) and takes writes again.

As master it fences proxies' requests (:meth:`GroupRole.check_epoch`, called by
the internal service for every request that names an epoch): only those meant
for its own epoch are served, and none once it is deposed.

A master deposed and back in touch with etcd (``GroupMember.on_demoted``)
sets :attr:`GroupRole.demoted` too: it starts over as a replica whose follower
cuts the unreplicated tail (``follower``) before following the new master.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from halfmoon.cluster.errors import CoordinatorUnavailable
from halfmoon.cluster.internal import fencing
from halfmoon.cluster.internal.internal_tls import PLAINTEXT, InternalTls
from halfmoon.cluster.internal.peer_tls import PLAIN_PEERS, PeerTls
from halfmoon.cluster.internal.replica_reads import ReplicaReadService
from halfmoon.config import replication_defaults as defaults
from halfmoon.errors import HalfmoonError
from halfmoon.replication import protocol
from halfmoon.replication.coordination import GroupMember, MasterRecord
from halfmoon.replication.epochs import EpochTable
from halfmoon.replication.follower import Follower
from halfmoon.replication.leader import ReplicationLeader, ReplicationSettings
from halfmoon.replication.replicated_store import ReplicatedStore
from halfmoon.store.store import MessageStore

log = logging.getLogger("halfmoon.replication")


@dataclass
class GroupOptions:
    group: str
    member: str
    settings: ReplicationSettings = field(default_factory=ReplicationSettings)
    ttl_s: int = defaults.LEASE_TTL_S
    facts: dict[str, Any] = field(default_factory=dict)
    # Facts read again every 30 s (the disk figures of cluster list), see coordination.py.
    facts_source: Callable[[], dict[str, Any]] | None = None
    unclean_election: bool = False  # the controller may appoint outside the in-sync set


class GroupRole:
    def __init__(
        self,
        store: MessageStore,
        options: GroupOptions,
        member: GroupMember,
        epochs: EpochTable,
        master: MasterRecord | None,
        *,
        acknowledged: int = 0,
        on_truncate: Callable[[int], None] | None = None,
        tls: InternalTls = PLAINTEXT,
    ) -> None:
        self.store = store
        self.options = options
        self.member = member
        self.epochs = epochs
        self.leader: ReplicationLeader | None = None
        self.follower: Follower | None = None
        self.promoted = threading.Event()  # a controller appointed this replica master
        self.demoted = threading.Event()  # handed over, or deposed: rejoin as a replica
        self._replicated: ReplicatedStore | None = None
        self._handing_over = threading.Lock()
        self._appointed: MasterRecord | None = None
        # Pulls and bulk reads from proxies, served while a replica with --replica-reads.
        self.reads = ReplicaReadService(store, self._read_limit, self._await_commit)
        if master is not None:
            self._lead(master)
        else:
            self.epoch = epochs.latest
            self.follower = Follower(
                store, options.group, options.member, epochs, self._find_master,
                acknowledged=acknowledged, on_truncate=on_truncate, tls=tls,
            )  # fmt: skip
            self.follower.start()

    def _lead(self, master: MasterRecord) -> None:
        self.epoch = master.epoch
        # The new epoch's writes begin at this log's end: what a returning deposed master
        # compares its own table against.
        self.epochs.record(master.epoch, self.store.end_offset)
        self.leader = ReplicationLeader(
            self.store, self.options.group, self.options.member, master.epoch, self.epochs,
            self.options.settings, publish=self._publish,
        )  # fmt: skip
        self.member.on_deposed = self.leader.depose
        self.member.on_demoted = self.demoted.set
        self.leader.start()

    def _find_master(self) -> MasterRecord | None:
        """The master the follower should stream from; None (and :attr:`promoted` set) when
        etcd names this member itself, under its lease: a controller appointed it."""
        record = self.member.master()
        if record is None or record.member != self.options.member:
            return record
        appointed = self.member.appointment()
        if appointed is not None and not self.promoted.is_set():
            self._appointed = appointed
            log.warning(
                "event=appointed_master group=%s member=%s epoch=%d",
                self.options.group, self.options.member, appointed.epoch,
            )  # fmt: skip
            self.promoted.set()
        return None

    def _read_limit(self) -> int | None:
        """Where reads served here stop (the group's committed point), or None: no reads."""
        follower = self.follower
        if follower is None or not self.options.settings.replica_reads:
            return None
        return follower.committed_offset

    def _await_commit(self, past: int, timeout_s: float) -> None:
        follower = self.follower
        if follower is not None:
            follower.wait_committed(past, timeout_s)

    def promote(self) -> None:
        """Stop following and take office in the appointed epoch (after :attr:`promoted`)."""
        assert self._appointed is not None and self.follower is not None
        self.follower.close()
        self.follower = None
        self._lead(self._appointed)

    @classmethod
    def decide(
        cls,
        store: MessageStore,
        options: GroupOptions,
        *,
        cluster: str,
        coordinator: str,
        endpoint: str,
        acknowledged: int = 0,
        on_truncate: Callable[[int], None] | None = None,
        campaign: bool = True,
        tls: PeerTls = PLAIN_PEERS,
    ) -> GroupRole:
        """Join and campaign; ``acknowledged`` and ``on_truncate`` go to a replica's follower
        (what this member acknowledged as master before it was deposed; told of a cut).
        ``campaign=False``: a deposed master starting over waits for the controller, as any
        replica does, rather than race it for the key it just gave up."""
        member = GroupMember(
            coordinator, cluster, options.group, options.member, endpoint,
            ttl_s=options.ttl_s, facts={**options.facts, "mode": options.settings.mode},
            facts_source=options.facts_source, tls=tls.etcd,
        )  # fmt: skip
        try:
            member.join()
            epochs = EpochTable(store.config.data_dir)
            may = campaign and member.may_campaign(epochs.latest)
            won = member.campaign(store.end_offset) if may else None
        except BaseException:
            member.leave()
            raise
        return cls(
            store, options, member, epochs, won, acknowledged=acknowledged,
            on_truncate=on_truncate, tls=tls.internal,
        )  # fmt: skip

    def announce(self, deadline_s: float | None = None) -> bool:
        """Tell proxies where this master is (the group's routing entry), once its broker
        serves: called after the internal service is registered and the port listens, so a
        proxy that hears of it can reach it at once. A master whose key changed meanwhile
        (appointed elsewhere, its lease lost) steps down instead; so does one that cannot
        reach etcd within ``deadline_s`` (the lease TTL), whose lease is gone by then anyway.
        Whether it announced."""
        assert self.leader is not None
        deadline = time.monotonic() + (self.options.ttl_s if deadline_s is None else deadline_s)
        while True:
            try:
                announced = self.member.announce(self.epoch)
                break
            except (CoordinatorUnavailable, TimeoutError) as error:
                if time.monotonic() >= deadline or self.demoted.wait(0.1):
                    log.warning(
                        "event=announce_failed group=%s error=%s", self.options.group, error
                    )
                    announced = False
                    break
        if not announced and not self.demoted.is_set():
            self._step_down(None)
        return announced

    def check_epoch(self, sent: int) -> None:
        """The fence of a proxy's request meant for epoch ``sent`` (``InternalService``):
        raises ``EPOCH_STALE`` when it is older than this master's epoch, ``MASTER_DEPOSED``
        when newer (another master was appointed) or when this member is not, or no longer,
        the master."""
        leader = self.leader
        refusal = fencing.epoch_refusal(
            sent,
            None if leader is None else leader.epoch,
            deposed=leader is None or leader.deposed or self.demoted.is_set(),
            group=self.options.group,
            member=self.options.member,
        )
        if refusal is not None:
            raise refusal

    @property
    def is_master(self) -> bool:
        return self.leader is not None

    @property
    def role(self) -> str:
        return "master" if self.is_master else "replica"

    def broker_store(self) -> ReplicatedStore:
        assert self.leader is not None
        self._replicated = ReplicatedStore(self.store, self.leader)
        return self._replicated

    def _publish(self, isr: list[str]) -> bool:
        settings = self.options.settings
        return self.member.publish_isr(
            isr,
            self.epoch,
            {
                "mode": settings.mode,
                "min_insync_replicas": settings.min_insync,
                "replica_reads": settings.replica_reads,
            },
        )

    def status(self) -> dict[str, Any]:
        if self.leader is not None:
            return self.leader.status()
        assert self.follower is not None
        return {**self.follower.status(), "reads_served": self.reads.served}

    def handler(self) -> grpc.GenericRpcHandler:
        methods: dict[str, grpc.RpcMethodHandler] = {
            "Status": grpc.unary_unary_rpc_method_handler(self._status),
            "EpochEnd": grpc.unary_unary_rpc_method_handler(self._epoch_end),
            "Handover": grpc.unary_unary_rpc_method_handler(self._handover),
            # Looked up per call: a replica promoted later serves Stream from then on.
            "Stream": grpc.stream_stream_rpc_method_handler(self._stream),
        }
        return grpc.method_handlers_generic_handler(protocol.SERVICE, methods)

    def _stream(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        leader = self.leader
        if leader is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"REPLICATION_REFUSED: {self.options.member} is a replica, not the master",
            )
        assert leader is not None
        return leader.stream(requests, context)

    def _epoch_end(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        leader = self.leader
        if leader is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"REPLICATION_REFUSED: {self.options.member} is a replica, not the master",
            )
        assert leader is not None
        try:
            return protocol.encode(leader.epoch_end(protocol.decode(request)))
        except HalfmoonError as error:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{error.code}: {error.message}")
        raise AssertionError("unreachable: abort raises")

    def _status(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            body = protocol.decode(request)
        except HalfmoonError:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST: bad Status")
        follower = self.follower
        if body.get("check_appointment") and follower is not None:
            # A controller just appointed a master (this replica or another): look now, not
            # at the next check; the follower too, so it follows the new master at once.
            with contextlib.suppress(Exception):
                self._find_master()
            follower.look_now()
        status = self.status()
        try:
            asked = body.get("queues", [])
            # What this member's own consume queues hold: [[topic, queue id], ...] → max offsets.
            status["max_offsets"] = [self.store.max_offset(str(t), int(q)) for t, q in asked]
        except (HalfmoonError, TypeError, ValueError):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST: bad Status")
        return protocol.encode(status)

    # -- planned switchover ------------------------------------------------------------------

    def _handover(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            body = protocol.decode(request)
            epoch = protocol.field(body, "epoch", int)
            target = protocol.field(body, "to", str)
            timeout_s = protocol.field(body, "timeout_ms", int) / 1000
            hold_s = protocol.field(body, "hold_ms", int) / 1000
        except HalfmoonError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{error.code}: {error.message}")
        leader, store = self.leader, self._replicated
        if leader is None or store is None or leader.deposed or self.demoted.is_set():
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"SWITCHOVER_NO_MASTER: {self.options.member} is not the group's master",
            )
        assert leader is not None and store is not None
        if epoch != leader.epoch:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"SWITCHOVER_EPOCH_CHANGED: the master is in epoch {leader.epoch}, not {epoch}",
            )
        if not self._handing_over.acquire(blocking=False):
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "SWITCHOVER_IN_PROGRESS: the master is handing over already",
            )
        fenced = time.monotonic()
        store.fence()
        end = leader.wait_replica(target, timeout_s)
        if end is None:
            store.unfence()
            self._handing_over.release()
            log.warning(
                "event=switchover_timeout group=%s to=%s acked=%d end=%d",
                self.options.group, target, leader.acked(target), self.store.end_offset,
            )  # fmt: skip
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"SWITCHOVER_TIMEOUT: replica {target} held {leader.acked(target)} of the "
                f"master's {self.store.end_offset} log bytes after {timeout_s:g}s; the master "
                "takes writes again",
            )
        log.warning(
            "event=switchover_fenced group=%s to=%s end=%d", self.options.group, target, end
        )
        threading.Thread(
            target=self._await_successor, args=(store, hold_s), name="halfmoon-handover",
            daemon=True,
        ).start()  # fmt: skip
        return protocol.encode(
            {"end_offset": end, "epoch": leader.epoch,
             "fenced_ms": int((time.monotonic() - fenced) * 1000)}
        )  # fmt: skip

    def _await_successor(self, store: ReplicatedStore, hold_s: float) -> None:
        """After a handover: step down once etcd names another master; take writes back if
        nobody is named within ``hold_s`` (the controller failed or lost a race)."""
        deadline = time.monotonic() + hold_s
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(Exception):  # etcd away: look again
                    record = self.member.master()
                    if record is None or record.member != self.options.member:
                        self._step_down(record)
                        return
                self.demoted.wait(0.02)
            if self.member.reassert():
                store.unfence()
                log.warning("event=switchover_abandoned group=%s", self.options.group)
            else:
                self._step_down(self.member.master())
        except Exception:
            log.exception("event=switchover_watch_failed group=%s", self.options.group)
            self._step_down(None)
        finally:
            self._handing_over.release()

    def _step_down(self, successor: MasterRecord | None) -> None:
        log.warning(
            "event=stepped_down group=%s member=%s successor=%s epoch=%s",
            self.options.group, self.options.member,
            successor.member if successor else None, successor.epoch if successor else None,
        )  # fmt: skip
        self.member.master_revision = 0
        if self.leader is not None:
            self.leader.depose()
        self.demoted.set()

    def close(self) -> None:
        """Stop replicating and leave the group (revoking the lease: a master's key goes)."""
        try:
            if self.follower is not None:
                self.follower.close()
            if self.leader is not None:
                self.leader.close()
        finally:
            with contextlib.suppress(Exception):
                self.member.leave()
