"""The AMQP topology of a cluster, in etcd: every proxy serves the same exchanges and queues.

One key per entity under ``/halfmoon/<cluster>/amqp/<vhost>/``: ``e/<exchange>``,
``q/<queue>``, ``b/<digest of the binding>`` (names percent-encoded), each a
JSON object that also names the vhost's namespace. Durable entities are plain
keys and outlive every proxy; transient ones, exclusive queues and any binding
with a transient end are attached to this worker's lease, so they end with
the proxy that declared them (RabbitMQ's transient entities end with their
node) whether it stops or is killed.

How a proxy learns of the others' changes: it **watches** the prefix
(:func:`~halfmoon.cluster.coordination.follow.follow_prefix`), so publishes route on
memory at no cost to etcd, and it **reads through** where a watch's delay
would be seen by a client: every method that changes the topology first lists
its vhost, and a publish that reaches no queue, or names an exchange not
known here, lists it once before deciding (so an exchange, queue or binding
declared through another proxy before this publish was sent is always seen).
Concurrent listings of one vhost share one etcd read.

Saving writes the difference between the vhost in memory and what etcd is
known to hold: a new entity is a create (compare on the key's create
revision), so of two proxies declaring one name differently at once, the
second gets 406 and the first one's definition; a removed entity is a delete.
Each key's revision is remembered, so a watch event older than this
process's own write of the key is not applied over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

from halfmoon.amqp.reply_codes import PRECONDITION_FAILED, AmqpChannelError
from halfmoon.amqp.topology import (
    Binding,
    Exchange,
    Queue,
    Topology,
    VHost,
    binding_of,
    plain,
    unplain,
)
from halfmoon.cluster.coordination.etcd import EtcdClient, WatchBatch, delete_op
from halfmoon.cluster.coordination.etcd_json import EtcdRequestError, KeyValue
from halfmoon.cluster.coordination.follow import follow_prefix
from halfmoon.cluster.coordination.keys import ClusterKeys
from halfmoon.cluster.coordination.metadata import encode
from halfmoon.cluster.errors import CoordinatorUnavailable

log = logging.getLogger("halfmoon.cluster.amqp")

FIRST_LISTING_S = 10.0  # a proxy that cannot read the topology does not serve AMQP
BUILT_IN = frozenset(("", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"))


def _part(name: str) -> str:
    return quote(name, safe="")


def entities(vhost: VHost) -> dict[str, tuple[bytes, bool]]:
    """The vhost's keys under its prefix (``e/…``, ``q/…``, ``b/…``): each value and
    whether it is leased (ends with this proxy)."""
    found: dict[str, tuple[bytes, bool]] = {}
    lasting: set[str] = set(BUILT_IN)  # exchanges that outlive the proxy
    for name, e in vhost.exchanges.items():
        if name in BUILT_IN:
            continue
        value = {
            "namespace": vhost.namespace,
            "type": e.type,
            "durable": e.durable,
            "auto_delete": e.auto_delete,
            "internal": e.internal,
            "arguments": plain(e.arguments),
        }
        found["e/" + _part(name)] = (encode(value), not e.durable)
        if e.durable:
            lasting.add(name)
    lasting_queues: set[str] = set()
    for name, q in vhost.queues.items():
        value = {
            "namespace": vhost.namespace,
            "stored": q.stored,
            "durable": q.durable,
            "exclusive_owner": q.exclusive_owner,
            "auto_delete": q.auto_delete,
            "arguments": plain(q.arguments),
        }
        leased = not q.durable or q.exclusive_owner is not None
        found["q/" + _part(name)] = (encode(value), leased)
        if not leased:
            lasting_queues.add(name)
    for b in vhost.bindings:
        value = {
            "namespace": vhost.namespace,
            "source": b.source,
            "destination": b.destination,
            "to_exchange": b.to_exchange,
            "routing_key": b.routing_key,
            "arguments": json.loads(b.arguments_json),
        }
        raw = encode(value)
        leased = b.source not in lasting or b.destination not in (
            lasting if b.to_exchange else lasting_queues
        )
        found["b/" + hashlib.sha256(raw).hexdigest()[:32]] = (raw, leased)
    return found


def _apply(vhost: VHost, entity: str, value: Mapping[str, Any] | None) -> Queue | None:
    """Set (``value``) or remove (None) one entity of ``vhost``; the queue removed, if any."""
    kind, _, name_part = entity.partition("/")
    if kind == "e":
        name = unquote(name_part)
        if value is None:
            vhost.exchanges.pop(name, None)
        else:
            vhost.exchanges[name] = Exchange(
                name,
                value["type"],
                value["durable"],
                value["auto_delete"],
                value["internal"],
                unplain(value["arguments"]),
            )
    elif kind == "q":
        name = unquote(name_part)
        if value is None:
            return vhost.queues.pop(name, None)
        found = vhost.queues.get(name)
        if found is not None and found.stored == value["stored"]:
            # The same queue: its consumers hold this object, so it is updated in place.
            found.durable = value["durable"]
            found.exclusive_owner = value["exclusive_owner"]
            found.auto_delete = value["auto_delete"]
            found.arguments = unplain(value["arguments"])
        else:
            vhost.queues[name] = Queue(
                name,
                value["stored"],
                value["durable"],
                value["exclusive_owner"],
                value["auto_delete"],
                unplain(value["arguments"]),
            )
            return found
    elif kind == "b" and value is not None:
        vhost.bindings.add(_binding(value))
    return None


def _binding(value: Mapping[str, Any]) -> Binding:
    return binding_of(
        value["source"],
        value["destination"],
        value["to_exchange"],
        value["routing_key"],
        unplain(value["arguments"]),
    )


class EtcdTopologyStore:
    """A cluster proxy worker's view of the AMQP topology, and its writes to it."""

    shared = True

    def __init__(self, client: EtcdClient, cluster: str, lease_ttl_s: int) -> None:
        self._client = client
        self.prefix = ClusterKeys(cluster).prefix + "amqp/"
        self._ttl_s = lease_ttl_s
        self._lease = 0
        self._renewer: asyncio.Task[None] | None = None
        self._follower: asyncio.Task[None] | None = None
        self._topology: Topology | None = None
        # What etcd holds as last heard (key -> value) and the revision each key was
        # last written at as far as this process knows (deletes included).
        self._stored: dict[str, bytes] = {}
        self._revision: dict[str, int] = {}
        self._writing = asyncio.Lock()
        self._listing: dict[str, asyncio.Task[bool]] = {}
        self._first = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------

    async def open(self, topology: Topology) -> None:
        self._topology = topology
        self._lease = await self._client.grant_lease(self._ttl_s)
        self._renewer = asyncio.create_task(self._renew(), name="amqp topology lease")
        self._follower = asyncio.create_task(
            follow_prefix(
                self._client, self.prefix, what="amqp", listed=self._listed, changed=self._changed
            ),
            name="amqp topology",
        )
        try:
            await asyncio.wait_for(self._first.wait(), FIRST_LISTING_S)
        except TimeoutError:
            await self.close()
            raise CoordinatorUnavailable(
                f"could not read the AMQP topology from etcd within {FIRST_LISTING_S:g} s"
            ) from None

    async def close(self) -> None:
        tasks = [t for t in (self._follower, self._renewer) if t is not None]
        self._follower = self._renewer = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._lease:
            try:  # this proxy's transient entities go with it
                await self._client.revoke_lease(self._lease)
            except (CoordinatorUnavailable, EtcdRequestError) as error:
                log.warning("event=amqp_lease_not_revoked error=%s", error)
            self._lease = 0

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self._ttl_s / 3)
            try:
                if not await self._client.keep_alive(self._lease):
                    # Lapsed (etcd away longer than the TTL): etcd dropped this proxy's
                    # transient entities; a new lease and a save of them put them back.
                    self._lease = await self._client.grant_lease(self._ttl_s)
                    log.warning("event=amqp_lease_renewed_after_expiry")
                    if self._topology is not None:
                        self._forget_leased()
                        await self.save(self._topology)
            except (CoordinatorUnavailable, EtcdRequestError) as error:
                log.warning("event=amqp_lease_renewal_failed error=%s", error)

    def _forget_leased(self) -> None:
        assert self._topology is not None
        for vhost in self._topology.vhosts.values():
            base = self._vhost_prefix(vhost.name)
            for entity, (_, leased) in entities(vhost).items():
                if leased:
                    self._stored.pop(base + entity, None)

    # -- following -----------------------------------------------------------------------

    def _vhost_prefix(self, vhost: str) -> str:
        return f"{self.prefix}{_part(vhost)}/"

    def _split(self, key: str) -> tuple[str, str] | None:
        rest = key.removeprefix(self.prefix)
        vhost_part, sep, entity = rest.partition("/")
        if rest == key or not sep or "/" not in entity:
            return None
        return unquote(vhost_part), entity

    def _heard(self, key: str, value: bytes | None, revision: int) -> bool:
        """Apply one key as etcd reported it at ``revision``; whether anything changed."""
        if revision < self._revision.get(key, 0) or self._stored.get(key) == value:
            return False
        split = self._split(key)
        if split is None or self._topology is None:
            return False
        self._revision[key] = revision
        before = self._stored.pop(key, None)
        if value is not None:
            self._stored[key] = value
        vhost_name, entity = split
        if value is None:
            vhost = self._topology.vhosts.get(vhost_name)
            if vhost is None:
                return False
            if entity.startswith("b/"):
                # A binding's key is a digest: which binding it was, its last value says.
                if before is not None:
                    vhost.bindings.discard(_binding(json.loads(before)))
                return True
            decoded = None
        else:
            decoded = json.loads(value)
            vhost = self._topology.vhost(vhost_name, decoded["namespace"])
        gone = _apply(vhost, entity, decoded)
        if gone is not None:
            self._topology.on_queue_gone(vhost, gone)
        return True

    async def _listed(self, kvs: list[KeyValue], revision: int) -> None:
        self._reconcile(self.prefix, kvs, revision)
        self._first.set()

    def _reconcile(self, prefix: str, kvs: list[KeyValue], revision: int) -> bool:
        """Make what is known under ``prefix`` what a listing at ``revision`` found."""
        changed = False
        listed = {kv.key: kv for kv in kvs}
        for kv in kvs:
            changed |= self._heard(kv.key, kv.value, kv.mod_revision)
        for key in [k for k in self._stored if k.startswith(prefix) and k not in listed]:
            changed |= self._heard(key, None, revision)
        return changed

    async def _changed(self, batch: WatchBatch) -> None:
        for event in batch.events:
            value = None if event.kind == "DELETE" else event.kv.value
            self._heard(event.kv.key, value, event.kv.mod_revision)

    async def catch_up(self, topology: Topology, vhost: VHost) -> bool:
        """List ``vhost``'s keys now (one listing shared by concurrent callers)."""
        name = vhost.name
        # A listing that began before this call may have been read before a write the
        # caller already saw answered: wait it out, then join (or start) a later one.
        earlier = self._listing.get(name)
        if earlier is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(earlier)
        current = self._listing.get(name)
        if current is None or current is earlier:
            current = asyncio.ensure_future(self._list(name))
            self._listing[name] = current
            current.add_done_callback(lambda done: self._listed_once(name, done))
        return await asyncio.shield(current)

    def _listed_once(self, name: str, done: asyncio.Future[bool]) -> None:
        if self._listing.get(name) is done:
            del self._listing[name]

    async def _list(self, vhost: str) -> bool:
        prefix = self._vhost_prefix(vhost)
        try:
            kvs, revision = await self._client.get_prefix(prefix)
        except (CoordinatorUnavailable, EtcdRequestError) as error:
            # etcd away: route on what the watch last brought (a change to the topology
            # fails at its save instead).
            log.warning("event=amqp_topology_catch_up_failed vhost=%s error=%s", vhost, error)
            return False
        return self._reconcile(prefix, kvs, revision)

    # -- writing -------------------------------------------------------------------------

    async def save(self, topology: Topology) -> None:
        # What to write is taken now, before any wait: a change heard from etcd while this
        # save waits its turn must not hide the change the caller just made.
        plans = [(vhost, self._plan(vhost)) for vhost in list(topology.vhosts.values())]
        async with self._writing:
            for vhost, (removed, wanted) in plans:
                await self._write(vhost, removed, wanted)

    def _plan(self, vhost: VHost) -> tuple[list[str], dict[str, tuple[bytes, bool]]]:
        """The keys to delete and the keys to write (value, leased) for ``vhost``."""
        base = self._vhost_prefix(vhost.name)
        wanted = {base + entity: item for entity, item in entities(vhost).items()}
        removed = [k for k in self._stored if k.startswith(base) and k not in wanted]
        changed = {k: item for k, item in wanted.items() if self._stored.get(k) != item[0]}
        return removed, changed

    async def _write(
        self, vhost: VHost, removed: list[str], wanted: dict[str, tuple[bytes, bool]]
    ) -> None:
        for key in removed:
            result = await self._client.txn([], [delete_op(key)])
            self._stored.pop(key, None)
            self._revision[key] = max(self._revision.get(key, 0), result.revision)
        for key, (value, leased) in wanted.items():
            if self._stored.get(key) == value:
                continue  # written meanwhile (by an earlier save, or heard from etcd)
            lease = self._lease if leased else 0
            created, kv = await self._client.create(key, value, lease=lease)
            if created or kv.value == value:
                self._stored[key] = value
                self._revision[key] = max(self._revision.get(key, 0), kv.mod_revision)
                continue
            # Declared differently through another proxy at the same moment: theirs stands.
            self._heard(key, kv.value, kv.mod_revision)
            split = self._split(key)
            what = split[1] if split else key
            raise AmqpChannelError(
                PRECONDITION_FAILED,
                f"{unquote(what)!r} in vhost {vhost.name!r} was declared differently through "
                "another proxy at the same time; declare it as it is now or delete it first",
            )
