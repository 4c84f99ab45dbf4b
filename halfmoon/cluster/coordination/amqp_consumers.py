"""Every proxy worker's AMQP consumers in etcd, and the decisions that count them all.

A queue's consumers live in the proxy workers their connections reached; each
worker records its own here (``AmqpServer``'s ``cluster_consumers``), one
directory per queue beside the cluster's prefix, not under it (proxies and
brokers watch the cluster's prefix, and a consumer starting should not wake
them)::

    /halfmoon-amqp-consumers/<cluster>/<queue>/c/<consumer>  one consumer      worker's lease
    /halfmoon-amqp-consumers/<cluster>/<queue>/x             held exclusively  worker's lease
    /halfmoon-amqp-consumers/<cluster>/<queue>/armed         auto-delete: has had a consumer
    /halfmoon-amqp-consumers/<cluster>/<queue>/used          x-expires: last used (wall ms)
    /halfmoon-amqp-consumers/<cluster>/<queue>/deleting      a worker deletes it  its lease

``<queue>`` is the queue's stored name (its vhost's namespace and name),
percent-encoded. The lease is the worker's session-directory lease, so a
worker that dies (or is cut off from etcd past its TTL) loses its consumers
with it.

- **Consume** (one etcd transaction, a round trip): a consumer's key is
  written only if no ``deleting`` key is there and, for a shared consumer, no
  ``x`` key; an exclusive one only if the queue has no consumer key at all, and
  it writes ``x`` in the same transaction. etcd applies transactions one at a
  time, so of two workers racing for one queue exactly one wins. A consumer of
  an ``auto-delete`` queue also writes ``armed`` (RabbitMQ deletes such a queue
  only once it has had a consumer).
- **Cancel**: the key is deleted (kept trying every :data:`RETRY_EVERY_S`
  while etcd is away; meanwhile the queue counts as used, never as free).
- **Counts** (Declare-Ok, ``if-unused``) are read from etcd (counted there).
- **Deleting a queue nobody asked to delete** (auto-delete, x-expires): the
  worker that sees a reason takes the ``deleting`` key in a transaction that
  also checks the reason holds in etcd (no consumer key; ``armed`` there, or
  ``used`` unchanged since it last heard of it), then deletes the queue as
  ``queue.delete`` would and the whole directory with it. One worker can take
  the key; while it is there consumes are refused; a worker that dies
  holding it loses it with its lease, and another takes it again; one whose
  delete failed lets it go after :data:`CLAIM_HELD_S`.
- **A lapsed lease** (the worker cut off from etcd past its TTL, taken for
  dead meanwhile): the worker records its consumers again under its new
  lease (an exclusive one moving its own ``x``), and lets go of any the
  cluster no longer lets in (another worker took the queue meanwhile).
- **A new queue** clears ``armed`` left by an earlier queue of its name (a
  deletion cut short), only while no consumer key is there: another proxy
  declaring the same queue at this moment may have consumers on it already.
- **What a deletion cut short left** (``armed``, ``used``: the unleased keys) is
  cleared by the housekeeping of any worker that has known no queue of that
  name for :data:`LEFTOVER_AFTER_S`, in a transaction that checks there is no
  consumer and no deletion (:meth:`EtcdClusterConsumers.clear_leftovers`).
- **Who notices**: the worker whose cancel removed the last consumer tries at
  once; every worker also follows the directories (a watch) and its
  housekeeping tries each second for a queue that looks due, which covers a
  dead worker's consumers ending with its lease. What it heard is only a hint:
  the transaction decides.
- **x-expires**: a use (a non-passive declare, a Basic.Get, the last consumer
  of a worker going) rewrites ``used``, at most once per :func:`refresh_s` (5 s,
  or a quarter of the queue's x-expires if shorter) per worker, the last use of
  a burst written at the end of the period. A worker takes a queue for unused
  once it has heard of no use (no change of its keys, no use of its own) for
  its x-expires plus that period, measured on its own clock from when it heard,
  so clocks of different machines never meet; the transaction then checks that
  ``used`` did not change since. A queue is deleted late by at most that period
  and a housekeeping sweep, never early. A worker that starts, or that lost
  its watch, has heard nothing yet: its clock for every queue starts then.

With etcd unreachable nothing is decided on a guess: a consume (of either
kind) and an ``if-unused`` delete raise :class:`ConsumersUnknown` (the server
refuses them), no queue is deleted, Declare-Ok counts this worker's consumers
only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from halfmoon.amqp.cluster_consumers import ConsumersUnknown, Deletion, Refusal
from halfmoon.amqp.housekeeping import expires_ms
from halfmoon.amqp.topology import Queue
from halfmoon.cluster.coordination.etcd import (
    Compare,
    EtcdClient,
    WatchBatch,
    delete_op,
    delete_prefix_op,
    get_op,
    put_op,
)
from halfmoon.cluster.coordination.etcd_json import EtcdRequestError, KeyValue
from halfmoon.cluster.coordination.follow import follow_prefix
from halfmoon.cluster.coordination.keys import ROOT, check_name
from halfmoon.errors import HalfmoonError

log = logging.getLogger("halfmoon.cluster.amqp")

CONSUMERS_ROOT = ROOT.rstrip("/") + "-amqp-consumers/"
RETRY_EVERY_S = 0.5  # a cancel's delete, a record lost with a lapsed lease: tried again
CLAIM_HELD_S = 10.0  # a deletion claimed and not done by then (it failed): let go
LEFTOVER_AFTER_S = 10.0  # a directory of no queue known here for this long: left behind
USED_EVERY_S = 5.0  # an x-expires queue's ``used`` rewritten at most this often (or faster)
_ETCD_FAILURES = (HalfmoonError, EtcdRequestError, OSError, TimeoutError)


def consumers_prefix(cluster: str) -> str:
    return f"{CONSUMERS_ROOT}{check_name('cluster', cluster)}/"


def refresh_s(expires: int) -> float:
    """How often a worker rewrites an x-expires queue's ``used`` key at most, and how much
    later than its x-expires a queue may go."""
    return min(USED_EVERY_S, expires / 4000)


@dataclass
class _Heard:
    """One queue's directory, as this worker last heard it."""

    quiet_since: float  # time.monotonic() of the last sign of use this worker had
    consumers: set[str] = field(default_factory=set)
    armed: bool = False
    deleting: bool = False
    used_revision: int = 0  # ``used``'s mod revision (0: none)


@dataclass
class _Mine:
    """One of this worker's consumers, as recorded."""

    stored: str
    key: str
    exclusive: bool
    auto_delete: bool
    lease: int


@dataclass
class _Uses:
    """One queue's uses here, for writing ``used`` at most every :func:`refresh_s`."""

    written_at: float = -1e9
    timer: asyncio.TimerHandle | None = None
    writing: bool = False


class EtcdClusterConsumers:
    """This worker's consumers in etcd and everyone's heard back (``AmqpServer``'s
    ``cluster_consumers``)."""

    def __init__(
        self, client: EtcdClient, cluster: str, worker: str, lease: Callable[[], int]
    ) -> None:
        self._client = client
        self.prefix = consumers_prefix(cluster)
        self._worker = worker
        self._lease = lease
        self._heard: dict[str, _Heard] = {}
        self._listed = False  # False before the first listing and after a lost watch
        self._mine: dict[str, _Mine] = {}
        # Keys of consumers gone but not yet deleted in etcd -> whether it held ``x`` too.
        self._undeleted: dict[str, bool] = {}
        self._uses: dict[str, _Uses] = {}
        self._claimed: dict[str, float] = {}  # deletions claimed here (monotonic), not done
        self._unknown_since: dict[str, float] = {}  # directories of no queue here (monotonic)
        self._tasks: list[asyncio.Task[None]] = []
        self._writes: set[asyncio.Task[None]] = set()  # ``used`` writes in flight
        self._loop = asyncio.get_running_loop()
        self.on_lost: Callable[[str], None] = lambda consumer_id: None

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(
                follow_prefix(
                    self._client,
                    self.prefix,
                    what="amqp consumers",
                    listed=self._on_listing,
                    changed=self._on_change,
                    lost=self._on_lost_watch,
                ),
                name="amqp consumers",
            ),
            asyncio.create_task(self._keep_records(), name="amqp consumer records"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for uses in self._uses.values():
            if uses.timer is not None:
                uses.timer.cancel()
        # What is left goes with the worker's lease, revoked next.

    @property
    def following(self) -> bool:
        """Whether this worker hears every change now (listed, its watch unbroken since)."""
        return self._listed

    # -- keys --------------------------------------------------------------------------

    def _directory(self, stored: str) -> str:
        return f"{self.prefix}{quote(stored, safe='')}/"

    def _consumer_key(self, stored: str, consumer_id: str) -> str:
        return f"{self._directory(stored)}c/{quote(consumer_id, safe='')}"

    # -- consumers ----------------------------------------------------------------------

    async def count(self, stored: str) -> int:
        try:
            return await self._client.count_prefix(self._directory(stored) + "c/")
        except _ETCD_FAILURES as error:
            raise ConsumersUnknown(str(error)) from error

    async def attach(self, consumer_id: str, queue: Queue, exclusive: bool) -> Refusal | None:
        mine = _Mine(
            queue.stored,
            self._consumer_key(queue.stored, consumer_id),
            exclusive,
            queue.auto_delete,
            self._lease(),
        )
        try:
            refusal = await self._record(mine)
        except _ETCD_FAILURES as error:
            raise ConsumersUnknown(str(error)) from error
        if refusal is None:
            self._mine[consumer_id] = mine
        return refusal

    async def _record(self, mine: _Mine, *, again: bool = False) -> Refusal | None:
        """Write ``mine``'s key if the cluster lets it (one transaction; ``again``: under a
        new lease, the old one perhaps still there)."""
        directory = self._directory(mine.stored)
        if mine.exclusive and again:
            # Written again under a new lease while the old one still holds the queue: the
            # queue's keys are this consumer's own, moved to the new lease.
            moved = await self._client.txn(
                [Compare(directory + "x", "VALUE", mine.key.encode())],
                [
                    put_op(mine.key, self._value(mine), mine.lease),
                    put_op(directory + "x", mine.key.encode(), mine.lease),
                ],
            )
            if moved.succeeded:
                return None
        compare = [Compare(directory + "deleting", "CREATE", 0)]
        writes = [put_op(mine.key, self._value(mine), mine.lease)]
        if mine.exclusive:  # no consumer at all; it holds the queue
            compare.append(Compare(directory + "c/", "CREATE", 0, prefix=True))
            writes.append(put_op(directory + "x", mine.key.encode(), mine.lease))
        else:  # no exclusive consumer
            compare.append(Compare(directory + "x", "CREATE", 0))
        if mine.auto_delete:
            writes.append(put_op(directory + "armed", b"1"))
        result = await self._client.txn(compare, writes, [get_op(directory + "deleting")])
        if result.succeeded:
            return None
        return Refusal.DELETING if result.kvs else Refusal.EXCLUSIVE

    def _value(self, mine: _Mine) -> bytes:
        return json.dumps({"worker": self._worker, "exclusive": mine.exclusive}).encode()

    async def detach(self, consumer_id: str) -> None:
        mine = self._mine.pop(consumer_id, None)
        if mine is None:
            return
        self._undeleted[mine.key] = mine.exclusive
        with contextlib.suppress(*_ETCD_FAILURES):
            await self._delete(mine.key)

    async def _delete(self, key: str) -> None:
        exclusive = self._undeleted.get(key)
        if exclusive is None:
            return
        if exclusive:  # and the queue's x key, while it is this consumer's
            x = key.rsplit("/c/", 1)[0] + "/x"
            await self._client.txn(
                [Compare(x, "VALUE", key.encode())],
                [delete_op(key), delete_op(x)],
                [delete_op(key)],
            )
        else:
            await self._client.txn([], [delete_op(key)])
        self._undeleted.pop(key, None)

    async def _keep_records(self) -> None:
        """Every :data:`RETRY_EVERY_S`: delete what a cancel could not, and write again the
        consumers a lapsed lease took (under the new one), ending those the cluster no
        longer lets in."""
        while True:
            await asyncio.sleep(RETRY_EVERY_S)
            try:
                for key in list(self._undeleted):
                    await self._delete(key)
                await self._let_go_of_failed_deletions()
                lease = self._lease()
                for consumer_id, mine in list(self._mine.items()):
                    if mine.lease != lease and self._mine.get(consumer_id) is mine:
                        await self._record_again(consumer_id, mine, lease)
            except _ETCD_FAILURES as error:
                log.warning("event=amqp_consumer_records_failed error=%s", error)

    async def _record_again(self, consumer_id: str, mine: _Mine, lease: int) -> None:
        """Write ``mine`` under ``lease`` (an etcd failure leaves it for the next round)."""
        moved = dataclasses.replace(mine, lease=lease)
        refusal = await self._record(moved, again=True)
        if self._mine.get(consumer_id) is not mine:
            # Cancelled meanwhile, perhaps deleted before this wrote it again: deleted again.
            self._undeleted[moved.key] = moved.exclusive
            return
        if refusal is None:
            self._mine[consumer_id] = moved
            return
        log.warning("event=amqp_consumer_lost queue=%s consumer=%s", mine.stored, consumer_id)
        del self._mine[consumer_id]
        self.on_lost(consumer_id)

    async def _let_go_of_failed_deletions(self) -> None:
        """A deletion claimed here that never finished (the delete failed, the queue is still
        there): its ``deleting`` key goes, so consumes are let in again and a worker tries
        again when it is still due."""
        now = time.monotonic()
        for stored, claimed_at in list(self._claimed.items()):
            if now - claimed_at < CLAIM_HELD_S:
                continue
            deleting = self._directory(stored) + "deleting"
            await self._client.txn(
                [Compare(deleting, "VALUE", self._worker.encode())], [delete_op(deleting)]
            )
            self._claimed.pop(stored, None)
            log.warning("event=amqp_queue_deletion_let_go queue=%s", stored)

    # -- x-expires -------------------------------------------------------------------------

    def used(self, queue: Queue) -> None:
        expires = expires_ms(queue)
        if expires is None:
            return
        stored = queue.stored
        heard = self._heard.get(stored)
        if heard is not None:
            heard.quiet_since = time.monotonic()
        uses = self._uses.setdefault(stored, _Uses())
        if uses.timer is not None or uses.writing:
            return  # a write is due: it writes this use too
        wait = uses.written_at + refresh_s(expires) - time.monotonic()
        if wait <= 0:
            self._write_used(stored, expires)
        else:
            uses.timer = self._loop.call_later(wait, self._write_used, stored, expires)

    def _write_used(self, stored: str, expires: int) -> None:
        uses = self._uses.setdefault(stored, _Uses())
        uses.timer = None
        uses.writing = True
        uses.written_at = time.monotonic()
        task = self._loop.create_task(self._put_used(stored, expires, uses))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _put_used(self, stored: str, expires: int, uses: _Uses) -> None:
        try:
            await self._client.put(
                self._directory(stored) + "used", str(int(time.time() * 1000)).encode()
            )
        except _ETCD_FAILURES as error:
            # Not written: this worker still counts the use (its own clock restarted), and
            # it writes again at the next use or the next period.
            log.warning("event=amqp_queue_use_unrecorded queue=%s error=%s", stored, error)
            uses.written_at = -1e9
            uses.timer = self._loop.call_later(
                refresh_s(expires), self._write_used, stored, expires
            )
        finally:
            uses.writing = False

    # -- deleting what nobody asked to -------------------------------------------------------

    def due(self, queue: Queue) -> Deletion | None:
        if not self._listed:
            return None
        now = time.monotonic()
        heard = self._heard.setdefault(queue.stored, _Heard(now))
        if heard.consumers or heard.deleting:
            return None
        if queue.auto_delete and heard.armed:
            return Deletion.AUTO_DELETE
        expires = expires_ms(queue)
        if expires is not None and now - heard.quiet_since >= expires / 1000 + refresh_s(expires):
            return Deletion.EXPIRED
        return None

    async def claim_deletion(self, queue: Queue, why: Deletion) -> bool:
        directory = self._directory(queue.stored)
        compare = [
            Compare(directory + "c/", "CREATE", 0, prefix=True),
            Compare(directory + "deleting", "CREATE", 0),
        ]
        if why is Deletion.AUTO_DELETE:
            compare.append(Compare(directory + "armed", "CREATE", 0, "GREATER"))
        else:
            heard = self._heard.get(queue.stored)
            if heard is None or self.due(queue) is not Deletion.EXPIRED:
                return False  # a use heard of since: not unused after all
            compare.append(Compare(directory + "used", "MOD", heard.used_revision))
        try:
            result = await self._client.txn(
                compare,
                [put_op(directory + "deleting", self._worker.encode(), self._lease())],
            )
        except _ETCD_FAILURES as error:
            log.warning(
                "event=amqp_queue_deletion_unclaimed queue=%s error=%s", queue.stored, error
            )
            return False
        if result.succeeded:
            self._claimed[queue.stored] = time.monotonic()
        return result.succeeded

    async def created(self, stored: str) -> None:
        # Only ``armed`` could harm the new queue (an auto-delete queue would go at once,
        # never consumed from); cleared only while no consumer is there, as another proxy
        # declaring the same queue at this moment may have consumers on it already.
        directory = self._directory(stored)
        try:
            await self._client.txn(
                [Compare(directory + "c/", "CREATE", 0, prefix=True)],
                [delete_op(directory + "armed")],
            )
        except _ETCD_FAILURES as error:
            raise ConsumersUnknown(str(error)) from error

    async def deleted(self, stored: str) -> None:
        self._claimed.pop(stored, None)
        for consumer_id in [c for c, m in self._mine.items() if m.stored == stored]:
            del self._mine[consumer_id]
        uses = self._uses.pop(stored, None)
        if uses is not None and uses.timer is not None:
            uses.timer.cancel()
        try:
            await self._client.txn([], [delete_prefix_op(self._directory(stored))])
        except _ETCD_FAILURES as error:
            # Left behind: the next queue of this name clears it (``created``); its
            # consumer keys end with their workers' leases.
            log.warning("event=amqp_queue_record_left queue=%s error=%s", stored, error)

    async def clear_leftovers(self, known: Callable[[str], bool]) -> None:
        """A directory heard of whose queue this worker has not known for
        :data:`LEFTOVER_AFTER_S` was left behind (its deleting worker died between the queue's
        delete and the directory's, or etcd refused the directory's delete): its keys go, in a
        transaction that checks no consumer and no deletion is there. The keys it can find
        are the unleased ``armed`` and ``used`` (the leased ones ended with their worker).
        Should a queue of that name have been declared meanwhile on a worker this one has
        not heard from yet, it loses at most those two, as :meth:`created` clears ``armed``
        anyway and a ``used`` gone only puts its expiry later."""
        if not self._listed:
            return
        now = time.monotonic()
        for stored in [s for s in self._unknown_since if s not in self._heard]:
            del self._unknown_since[stored]
        for stored, heard in list(self._heard.items()):
            if heard.consumers or heard.deleting or known(stored):
                self._unknown_since.pop(stored, None)
                continue
            if now - self._unknown_since.setdefault(stored, now) < LEFTOVER_AFTER_S:
                continue
            directory = self._directory(stored)
            try:
                result = await self._client.txn(
                    [
                        Compare(directory + "c/", "CREATE", 0, prefix=True),
                        Compare(directory + "deleting", "CREATE", 0),
                    ],
                    [delete_prefix_op(directory)],
                )
            except _ETCD_FAILURES as error:
                log.warning("event=amqp_queue_record_not_cleared queue=%s error=%s", stored, error)
                return
            self._unknown_since.pop(stored, None)
            if result.succeeded:
                log.info("event=amqp_queue_record_cleared queue=%s", stored)

    # -- following the directories -------------------------------------------------------

    def _split(self, key: str) -> tuple[str, str, str] | None:
        """(stored, kind, consumer) of a key, consumer empty but for ``c`` keys."""
        rest = key.removeprefix(self.prefix)
        if rest == key:
            return None
        quoted, _, tail = rest.partition("/")
        kind, _, consumer = tail.partition("/")
        return unquote(quoted), kind, consumer

    def _hear(self, key: str, kv: KeyValue | None, now: float) -> None:
        split = self._split(key)
        if split is None:
            return
        stored, kind, consumer = split
        heard = self._heard.setdefault(stored, _Heard(now))
        heard.quiet_since = now  # any change of a queue's keys is a sign of use
        present = kv is not None
        if kind == "c":
            if present:
                heard.consumers.add(consumer)
            else:
                heard.consumers.discard(consumer)
        elif kind == "armed":
            heard.armed = present
        elif kind == "deleting":
            heard.deleting = present
        elif kind == "used":
            heard.used_revision = kv.mod_revision if kv is not None else 0
        if not (heard.consumers or heard.armed or heard.deleting or heard.used_revision):
            # Nothing left of it (its last consumer gone, or the queue deleted): forgotten, so
            # queues that come and go leave nothing behind; its clock starts again from the
            # next time it is asked about, which is now or later, never earlier.
            del self._heard[stored]

    async def _on_listing(self, kvs: list[KeyValue], revision: int) -> None:
        now = time.monotonic()
        before = self._heard
        self._heard = {}
        for kv in kvs:
            self._hear(kv.key, kv, now)
        for stored in before:
            # Nothing was heard of it while the watch was lost: its clock starts now too.
            self._heard.setdefault(stored, _Heard(now))
        self._listed = True

    async def _on_change(self, batch: WatchBatch) -> None:
        now = time.monotonic()
        for event in batch.events:
            self._hear(event.kv.key, None if event.kind == "DELETE" else event.kv, now)

    async def _on_lost_watch(self, error: BaseException) -> None:
        self._listed = False  # changes may be missed until the next listing
