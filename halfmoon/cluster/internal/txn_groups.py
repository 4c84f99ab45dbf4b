"""Transaction groups spanning brokers: one coordinator broker per group decides, then the others.

A group's members may sit on several brokers (one group for every topic and
queue a Spark batch or a multi-topic commit wrote to). Each broker keeps its
own members and its own op log; this module makes the brokers of a cluster
decide a group as one (``docs/cluster.md``, "Transactions in cluster mode"):

1. ``end_transaction_group`` reaches any broker (through any proxy). That
   broker reads the group's coordinator from etcd
   (``/halfmoon/<cluster>/txn-groups/<group>``) or, at the group's first
   decision, creates that key with the broker the group id hashes to among the
   live brokers (compare-and-swap: every broker agrees on the first writer's
   choice). It forwards the call to the coordinator when that is another broker.
2. The coordinator records the decision in its own op log (the group's
   ``group_commit`` / ``group_rollback`` record, durable): **the commit point**.
   Its own members are completed with it.
3. It asks every other live broker to apply the decision to its members
   (``apply_transaction_group``); each appends its own group record, then its
   members. A broker that does not answer is left to step 5.
4. The answer to the caller counts the members completed.
5. The record in etcd is deleted once the group is finished everywhere: the
   coordinator has decided it, ``transaction.group_record_retention_ms`` has
   passed since its first decision, and every broker that could hold members
   (every live broker, every broker a topic is placed on) has applied the
   decision and so recorded it in its own op log. The coordinator looks for
   such groups every ``cleanup_interval_s`` (re-applying the decision, a
   no-op where it was applied, on each such broker first); a group with such
   a broker down keeps its record until that broker is back. The retention
   covers a broker down with members of a topic etcd does not place (one
   made on the broker directly): back within it, it still finds the decision.
6. Recovery is pulled by the participants: a broker with members of a group
   pending for longer than ``resolve_after_ms`` whose group has a coordinator
   in etcd asks that coordinator for its decision
   (``transaction_group_decision``) and applies it. A restarted participant
   does so at once, a live one whose coordinator crashed between participants
   within ``resolve_interval_s``. Until the decision is durable on the
   coordinator there is none: the members stay pending, and the caller, who
   got an error, decides again.
7. The transaction timeout (``transaction.group_timeout_ms``, or the
   producer's own): a broker holding members or consume actions of a group
   undecided past its deadline does not roll it back alone (another broker's
   members may be committed meanwhile); every ``resolve_interval_s`` it asks
   the coordinator to decide a rollback (``decide``, source ``check``). The
   coordinator records it first and tells the others, as any rollback; if the
   group was committed meanwhile the rollback is refused and step 6 applies
   the commit here.

Broker-to-broker calls go over the internal protocol (``RemoteBroker``).
``HALFMOON_TEST_TXN_CRASH_AT`` (tests only, :mod:`halfmoon.failpoints`) SIGKILLs the
process at a named step, so the crash matrix kills real processes at exact points.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, unquote

from halfmoon import failpoints
from halfmoon.broker.broker import Broker as InProcessBroker
from halfmoon.broker.transaction_state import TransactionStateError, TxnState
from halfmoon.broker.transactions.groups import check_group_id
from halfmoon.broker.transactions.resolutions import DecisionSource, Resolution
from halfmoon.cluster.coordination.etcd import Compare, delete_op, get_op, put_op
from halfmoon.cluster.coordination.etcd_json import b64, call_sync, key_value, range_prefix_sync
from halfmoon.cluster.coordination.etcd_tls import PLAIN, EtcdTls
from halfmoon.cluster.coordination.keys import ClusterKeys
from halfmoon.cluster.coordination.placement import ClusterTopic
from halfmoon.cluster.errors import ConsumeActionNotOnCoordinator, NoLiveBrokers
from halfmoon.cluster.internal.fencing import group_epoch
from halfmoon.cluster.internal.internal_tls import PLAINTEXT, InternalTls
from halfmoon.cluster.internal.remote_broker import RemoteBroker
from halfmoon.cluster.internal.wire import BrokerUnavailable
from halfmoon.errors import HalfmoonError

log = logging.getLogger("halfmoon.cluster")

# A participant that does not answer within this is left to ask for the decision itself, so a
# dead one (still registered until its lease expires) holds a decision up this long at most.
PARTICIPANT_TIMEOUT_S = 3.0
# A decision forwarded to the coordinator waits for it to reach the participants.
FORWARD_TIMEOUT_S = 30.0
RESOLVE_INTERVAL_S = 1.0
RESOLVE_AFTER_MS = 2_000
# A group not decided yet (a Spark batch still writing) is asked about less and less often.
UNDECIDED_BACKOFF_MAX_S = 30.0
# Transactional consumption's registrations: accepted only on the group's coordinator.
CONSUME_OPERATIONS = ("transactional_ack", "transactional_reject", "transactional_offset")
COORDINATORS_CACHED = 65536
# The transaction groups' directory beside the kinds the cluster view watches (it ignores it).
GROUPS_DIR = "txn-groups/"
# How often a coordinator deletes the etcd records of groups finished everywhere.
CLEANUP_INTERVAL_S = 5.0


def coordinator_for(group: str, brokers: Sequence[str]) -> str:
    """The broker ``group`` hashes to among ``brokers`` (CRC-32 of the id, names in order)."""
    if not brokers:
        raise NoLiveBrokers(f"no live broker to coordinate transaction group {group!r}")
    ordered = sorted(brokers)
    return ordered[zlib.crc32(group.encode()) % len(ordered)]


class GroupCoordination:
    """The cross-broker side of transaction groups for the broker process named ``name``."""

    def __init__(
        self,
        broker: InProcessBroker,
        name: str,
        cluster: str,
        etcd_endpoints: Sequence[str],
        *,
        resolve_interval_s: float = RESOLVE_INTERVAL_S,
        resolve_after_ms: int = RESOLVE_AFTER_MS,
        cleanup_interval_s: float = CLEANUP_INTERVAL_S,
        record_retention_ms: int = 600_000,
        tls: InternalTls = PLAINTEXT,
        etcd_tls: EtcdTls = PLAIN,
    ) -> None:
        self._broker = broker
        self._tls = tls  # towards the other brokers
        self._etcd_tls = etcd_tls
        self._name = name
        self._keys = ClusterKeys(cluster)
        self._etcd = list(etcd_endpoints)
        self._resolve_interval_s = resolve_interval_s
        self._resolve_after_ms = resolve_after_ms
        self._cleanup_interval_s = cleanup_interval_s
        self._record_retention_ms = record_retention_ms
        self._peers: dict[str, tuple[str, RemoteBroker]] = {}
        self._epochs: dict[str, int | None] = {}  # a broker group's master epoch, by name
        # group -> (monotonic time to ask again, current delay) for groups found undecided
        self._backoff: dict[str, tuple[float, float]] = {}
        self._members_seen: dict[str, tuple[str, str]] = {}
        self._coordinators: dict[str, str] = {}  # group -> its coordinator (never changes)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._resolve_loop, name="halfmoon-txn-groups", daemon=True
        )
        broker.expires_transaction_groups = False  # step 7: the coordinator decides

    def operations(self) -> dict[str, Callable[..., Any]]:
        """What the internal service serves for this module, by operation name."""
        served: dict[str, Callable[..., Any]] = {
            "end_transaction_group": self.decide,
            "end_transaction_group_nowait": self.decide,
            "apply_transaction_group": self.apply,
            "transaction_group_decision": self.decision,
        }
        for name in CONSUME_OPERATIONS:
            served[name] = self._on_coordinator_only(getattr(self._broker, name))
        return served

    def _on_coordinator_only(self, operation: Callable[..., Any]) -> Callable[..., Any]:
        """``operation`` (its first argument a transaction group), refused on any broker but
        the group's coordinator: a participant never holds consume actions, so nothing a
        participant does after the decision (fencing, its sweep) can undo part of a group."""

        @functools.wraps(operation)  # the internal service checks arguments against it
        def on_coordinator(transaction_group: str, *args: Any, **kwargs: Any) -> Any:
            coordinator = self.coordinator_of(check_group_id(transaction_group))
            if coordinator != self._name:
                raise ConsumeActionNotOnCoordinator(
                    f"transaction group {transaction_group!r} is coordinated by broker "
                    f"{coordinator!r}, and its acks, rejects and offset commits must be "
                    f"registered there, not on {self._name!r}: consume from queues of "
                    f"{coordinator!r} in this transaction, or use one transaction per broker"
                )
            return operation(transaction_group, *args, **kwargs)

        return on_coordinator

    def coordinator_of(self, group: str) -> str:
        """The group's coordinator, recorded in etcd now if it has none yet."""
        known = self._coordinators.get(group)
        if known is None:
            known = self._coordinator(group, self.live_brokers())
            if len(self._coordinators) >= COORDINATORS_CACHED:
                self._coordinators.clear()
            self._coordinators[group] = known
        return known

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for _, peer in peers:
            peer.close()

    # -- etcd ------------------------------------------------------------------------------------

    def _group_key(self, group: str) -> str:
        # Group ids may hold '/' and other characters a key segment must not: quoted.
        return f"{self._keys.prefix}{GROUPS_DIR}{quote(group, safe='')}"

    def live_brokers(self) -> dict[str, str]:
        """Registered brokers by name, with the endpoint each is reached at."""
        return {name: endpoint for name, (endpoint, _) in self._registered().items()}

    def _registered(self) -> dict[str, tuple[str, str]]:
        """Registered brokers: name -> (endpoint, instance: which process registered). A
        broker group's entry also names its master's epoch, which calls to it carry."""
        found, _ = range_prefix_sync(
            self._etcd, self._keys.kind_prefix("brokers"), tls=self._etcd_tls
        )
        brokers = {}
        epochs = {}
        for kv in found:
            value = kv.json()
            name = kv.key.rsplit("/", 1)[-1]
            brokers[name] = (str(value.get("endpoint", "")), str(value.get("instance", "")))
            epochs[name] = group_epoch(value)
        with self._lock:
            self._epochs = epochs
        return brokers

    def recorded_coordinator(self, group: str) -> str | None:
        """The coordinator etcd names for ``group``; None before its first decision."""
        answer = call_sync(
            self._etcd, "/kv/range", {"key": b64(self._group_key(group))}, tls=self._etcd_tls
        )
        kvs = answer.get("kvs", [])
        return str(key_value(kvs[0]).json()["coordinator"]) if kvs else None

    def _coordinator(self, group: str, brokers: Mapping[str, str]) -> str:
        """The group's coordinator: etcd's record, or a new one (compare-and-swap on creation)."""
        key = self._group_key(group)
        chosen = coordinator_for(group, list(brokers))
        value = json.dumps({"coordinator": chosen, "created_ms": int(time.time() * 1000)})
        answer = call_sync(
            self._etcd,
            "/kv/txn",
            {
                "compare": [Compare(key, "CREATE", 0).json()],
                "success": [put_op(key, value.encode())],
                "failure": [get_op(key)],
            },
            tls=self._etcd_tls,
        )
        if answer.get("succeeded"):
            return chosen
        for response in answer.get("responses", []):
            for kv in response.get("response_range", {}).get("kvs", []):
                return str(key_value(kv).json()["coordinator"])
        raise BrokerUnavailable(f"etcd answered no coordinator for transaction group {group!r}")

    def _peer(self, name: str, brokers: Mapping[str, str]) -> RemoteBroker:
        endpoint = brokers.get(name)
        if not endpoint:
            raise BrokerUnavailable(
                f"broker {name!r}, the coordinator of this transaction group, is not live: "
                "decide the group again once it is back"
            )
        with self._lock:
            epoch = self._epochs.get(name)
            known = self._peers.get(name)
            if known is not None and known[0] == endpoint and known[1].epoch == epoch:
                return known[1]
        # A group's master for the epoch etcd names (fencing.py): one deposed meanwhile refuses.
        peer = RemoteBroker(endpoint, timeout_s=PARTICIPANT_TIMEOUT_S, epoch=epoch, tls=self._tls)
        with self._lock:
            stale = self._peers.get(name)
            self._peers[name] = (endpoint, peer)
        if stale is not None:
            stale[1].close()
        return peer

    # -- operations ------------------------------------------------------------------------------

    def decide(
        self,
        group_id: str,
        resolution: Resolution,
        source: DecisionSource = DecisionSource.CLIENT,
        consume_actions: int | None = None,
    ) -> int:
        """Decide ``group_id`` on every broker: at its coordinator first, then the participants.

        ``consume_actions`` (transactional consumption, docs/transactions.md) is checked
        by the coordinator: the group's acks and offset commits must be registered there;
        elsewhere the count does not match and the coordinator rolls the group back."""
        check_group_id(group_id)
        resolution, source = Resolution.of(resolution), DecisionSource.of(source)
        if resolution is Resolution.UNKNOWN:
            return 0
        brokers = self.live_brokers()
        coordinator = self._coordinator(group_id, brokers)
        if coordinator != self._name:
            forwarded = self._peer(coordinator, brokers).connection.call(
                "end_transaction_group",
                [group_id, resolution, source, consume_actions],
                timeout_s=FORWARD_TIMEOUT_S,
            )
            return int(forwarded)
        failpoints.txn_group("coordinator-before-decision")
        try:
            count = self._broker.end_transaction_group(
                group_id, resolution, source, consume_actions
            )
        except HalfmoonError:
            # A commit turned into a rollback here (a fenced ack, a wrong consume_actions
            # count): the participants drop their members now rather than at their next ask.
            if self.decision(group_id) is Resolution.ROLLBACK:
                self._tell_participants(group_id, Resolution.ROLLBACK, source, brokers)
            raise
        failpoints.txn_group("coordinator-after-decision")
        return count + self._tell_participants(group_id, resolution, source, brokers)

    def _tell_participants(
        self,
        group_id: str,
        resolution: Resolution,
        source: DecisionSource,
        brokers: Mapping[str, str],
    ) -> int:
        """Step 4: every other broker applies the decision; the members they completed."""
        count = 0
        for name in sorted(brokers):
            if name == self._name:
                continue
            try:
                count += int(
                    self._peer(name, brokers).apply_transaction_group(group_id, resolution, source)
                )
            except HalfmoonError as exc:  # it asks for the decision when it is back
                log.warning(
                    "event=txn_group_participant_unreached group=%s broker=%s error=%s",
                    group_id,
                    name,
                    exc.code,
                )
                continue
            failpoints.txn_group("coordinator-between-participants")
        return count

    def apply(
        self,
        group_id: str,
        resolution: Resolution,
        source: DecisionSource = DecisionSource.CLIENT,
    ) -> int:
        """A participant's part: complete this broker's members as the coordinator decided."""
        count = self._broker.end_transaction_group(group_id, resolution, source)
        failpoints.txn_group("participant-after-apply")
        return count

    def decision(self, group_id: str) -> Resolution | None:
        """The decision recorded here on ``group_id``: commit, rollback, or None."""
        state = self._broker.transactions.group_decision(check_group_id(group_id))
        if state is TxnState.COMMITTED:
            return Resolution.COMMIT
        if state is TxnState.ROLLED_BACK:
            return Resolution.ROLLBACK
        return None

    # -- participant recovery --------------------------------------------------------------------

    def resolve_once(self, min_age_ms: int) -> int:
        """Ask the coordinators of this broker's undecided groups; the members completed."""
        groups = self._broker.transactions.undecided_groups(min_age_ms)
        if not groups:
            return 0
        registered = self._registered()
        if registered != self._members_seen:  # a broker (re)started: a decision may be waiting
            self._members_seen = registered
            self._backoff.clear()
        now = time.monotonic()
        self._backoff = {g: self._backoff[g] for g in groups if g in self._backoff}
        due = [g for g in groups if self._backoff.get(g, (0.0, 0.0))[0] <= now]
        brokers = {name: endpoint for name, (endpoint, _) in registered.items()}
        completed = 0
        for group in due:
            coordinator = self.recorded_coordinator(group)
            if coordinator is None or coordinator == self._name:
                # Never decided, or decided here (local recovery finishes it): ask later.
                self._back_off(group, now)
                continue
            if coordinator not in brokers:
                continue  # asked again when it is back
            decision = self._peer(coordinator, brokers).transaction_group_decision(group)
            if decision is None:
                continue  # its decision is not durable: none was made
            failpoints.txn_group("participant-before-apply")
            completed += self._broker.end_transaction_group(
                group, decision, DecisionSource.OPERATOR
            )
            log.info(
                "event=txn_group_resolved group=%s coordinator=%s decision=%s",
                group,
                coordinator,
                decision,
            )
        return completed

    # -- the transaction timeout (step 7) ----------------------------------------------------

    def expire_once(self) -> int:
        """Ask the coordinators of this broker's groups past their timeout to roll them back;
        how many were rolled back."""
        rolled = 0
        for group in self._broker.consuming.expired_groups(self._broker.clock.now_ms()):
            try:
                self.decide(group, Resolution.ROLLBACK, DecisionSource.CHECK)
            except TransactionStateError:
                continue  # committed meanwhile: resolve_once applies the commit here
            except HalfmoonError as exc:  # the coordinator is down: asked again next round
                log.warning("event=txn_group_timeout_undecided group=%s error=%s", group, exc.code)
                continue
            rolled += 1
            log.info("event=transaction_group_timed_out group=%s", group)
        return rolled

    # -- forgetting finished groups ----------------------------------------------------------

    def forget_finished(self) -> int:
        """Delete the etcd records of the groups this broker coordinates that are finished
        everywhere (decided here, applied on every broker that could hold members); how
        many were deleted. A group with such a broker down keeps its record: that broker
        finds the coordinator through it when it is back."""
        records, _ = range_prefix_sync(
            self._etcd, f"{self._keys.prefix}{GROUPS_DIR}", tls=self._etcd_tls
        )
        old_enough = int(time.time() * 1000) - self._record_retention_ms
        mine = [
            kv
            for kv in records
            if kv.json().get("coordinator") == self._name
            and int(kv.json().get("created_ms", 0)) <= old_enough
        ]
        if not mine:
            return 0
        live = self.live_brokers()
        holders = set(live) | self._placed_brokers()
        deleted = 0
        for kv in mine:
            group = unquote(kv.key.rsplit("/", 1)[-1])
            decision = self.decision(group)
            if decision is None:
                continue  # not decided (a decision in progress, or never made): kept
            if not self._applied_everywhere(group, decision, holders, live):
                continue
            # Only the record as read: a record made again since (a new decision attempt)
            # stays.
            answer = call_sync(
                self._etcd,
                "/kv/txn",
                {
                    "compare": [Compare(kv.key, "MOD", kv.mod_revision).json()],
                    "success": [delete_op(kv.key)],
                },
                tls=self._etcd_tls,
            )
            if answer.get("succeeded"):
                deleted += 1
                log.info("event=txn_group_forgotten group=%s decision=%s", group, decision)
        return deleted

    def _placed_brokers(self) -> set[str]:
        """Every broker a topic of the cluster has queues on (it may hold members)."""
        topics, _ = range_prefix_sync(
            self._etcd, self._keys.kind_prefix("topics"), tls=self._etcd_tls
        )
        brokers: set[str] = set()
        for kv in topics:
            with contextlib.suppress(Exception):  # a record of another shape holds no queue
                brokers.update(ClusterTopic.from_json(kv.json()).brokers)
        return brokers

    def _applied_everywhere(
        self, group: str, decision: Resolution, holders: set[str], live: Mapping[str, str]
    ) -> bool:
        for name in sorted(holders - {self._name}):
            if name not in live:
                return False  # down: it may hold members that need this record
            try:
                self._peer(name, live).apply_transaction_group(
                    group, decision, DecisionSource.OPERATOR
                )
            except HalfmoonError as exc:
                log.info("event=txn_group_kept group=%s broker=%s error=%s", group, name, exc.code)
                return False
        return True

    def _back_off(self, group: str, now: float) -> None:
        _, delay = self._backoff.get(group, (0.0, self._resolve_interval_s))
        delay = min(delay * 2, UNDECIDED_BACKOFF_MAX_S)
        self._backoff[group] = (now + delay, delay)

    def _resolve_loop(self) -> None:
        first = True
        next_cleanup = time.monotonic() + self._cleanup_interval_s
        while not self._stop.is_set():
            try:
                # After a restart every undecided member is asked about at once.
                self.resolve_once(0 if first else self._resolve_after_ms)
                first = False
                self.expire_once()
                if time.monotonic() >= next_cleanup:
                    next_cleanup = time.monotonic() + self._cleanup_interval_s
                    self.forget_finished()
            except HalfmoonError as exc:
                log.warning("event=txn_group_resolve_failed error=%s %s", exc.code, exc.message)
            except Exception:  # noqa: BLE001 - the loop must outlive a bug in one round
                log.exception("event=txn_group_resolve_failed")
            self._stop.wait(self._resolve_interval_s)
