"""The master's side of replication: ship the log, track replicas, keep the in-sync set.

Algorithm:

- Each replica holds one ``Stream``; the master ships its log as written
  (before its own fsync, which then overlaps the replica's) from where the
  replica's log ends, at most ``window`` bytes unacknowledged, and the
  replica acknowledges what is durable on its disk.
- **In-sync set (ISR)**, Kafka's rule: a replica is in sync while it caught up
  within the last ``max_lag_ms`` (an acknowledgement reaching the master's
  end as it stood at the replica's previous acknowledgement) and lags by at
  most ``max_lag_bytes``. A replica outside the set joins once it is in sync
  again *and* holds every acknowledged write (its acked offset reaches the
  highest acknowledged end, which starts at the master's log end when it
  took office: earlier epochs may have acknowledged all of it). Every
  ``ISR_CHECK_S`` the master computes the set; a change is first written to
  etcd (by the ``publish`` callable, a compare-and-swap only this epoch's
  master can win) and only then used.
  A shrink thus never takes effect unless etcd records it, so a future
  controller choosing a new master among the published set always finds one
  holding every acknowledged write.
- **Sync acknowledgement**: a write ending at offset E is acknowledged once it
  is durable on the master (its flush policy) and every replica of the ISR
  has acknowledged E, the ISR holding at least ``min_insync`` replicas. With
  fewer, a send is refused before it is written (:meth:`admit`, called by
  the broker's send path), and any other write's acknowledgement fails with
  :class:`NotEnoughReplicas` at once (it is on the master's disk and is
  replicated later, but was never acknowledged: RocketMQ's
  SLAVE_NOT_AVAILABLE). Group commit comes free: every write waiting when an
  acknowledgement arrives completes with it.
- A master whose lease was lost (``depose``) fails every waiting and later
  sync acknowledgement with :class:`MasterDeposed`.

Defaults (``defaults``): ``max_lag_ms`` 10 s and ``max_lag_bytes`` 64 MiB
(Kafka's ``replica.lag.time.max.ms`` is 30 s); window 8 MiB, chunks of at
most 1 MiB.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import grpc

from halfmoon.cluster.errors import MasterDeposed, NotEnoughReplicas
from halfmoon.config import replication_defaults as defaults
from halfmoon.errors import HalfmoonError
from halfmoon.replication import protocol
from halfmoon.replication.epochs import EpochTable
from halfmoon.replication.protocol import ReplicationRefused, StaleEpoch
from halfmoon.store.commitlog import OffsetGone
from halfmoon.store.store import MessageStore

log = logging.getLogger("halfmoon.replication")

ISR_CHECK_S = 0.1
IDLE_HEARTBEAT_S = 1.0


@dataclass
class ReplicationSettings:
    mode: str = defaults.MODE  # "sync": acknowledge once the in-sync replicas have it
    min_insync: int = defaults.MIN_INSYNC_REPLICAS
    max_lag_ms: int = defaults.REPLICA_MAX_LAG_MS
    max_lag_bytes: int = defaults.REPLICA_MAX_LAG_BYTES
    # Proxies may send pulls and bulk reads to in-sync replicas (RocketMQ's slaveReadEnable).
    replica_reads: bool = False

    def check(self) -> None:
        if self.mode not in ("sync", "async"):
            raise ValueError(f"replication mode is 'sync' or 'async', not {self.mode!r}")
        if self.min_insync < 0 or self.max_lag_ms <= 0 or self.max_lag_bytes <= 0:
            raise ValueError("min_insync_replicas >= 0 and positive lag bounds, please")


@dataclass
class ReplicaProgress:
    name: str
    acked: int = 0
    caught_up_ms: int = 0  # when it last reached the master's end (see the module)
    end_at_last_ack: int = 0
    streams: int = 0  # open streams (a reconnect may overlap the old one briefly)
    connected_ms: int = 0


@dataclass(order=True)
class _Waiter:
    end: int
    seq: int
    future: Future[None] = field(compare=False)


class ReplicationLeader:
    """State of a master's replication; ``handler()`` serves ``Stream`` and ``Status``."""

    def __init__(
        self,
        store: MessageStore,
        group: str,
        member: str,
        epoch: int,
        epochs: EpochTable,
        settings: ReplicationSettings,
        publish: Callable[[list[str]], bool],
        *,
        clock_ms: Callable[[], int] = lambda: int(time.monotonic() * 1000),
    ) -> None:
        self.store = store
        self.group = group
        self.member = member
        self.epoch = epoch
        self.epochs = epochs
        self.settings = settings
        self._publish = publish
        self._clock_ms = clock_ms
        self._lock = threading.Condition()
        self._replicas: dict[str, ReplicaProgress] = {}
        self.isr: list[str] = []  # as published in etcd
        # The highest end offset acknowledged under sync. It starts at the log's end when this
        # master takes office: any of it may have been acknowledged by an earlier epoch's master,
        # so a replica joins the in-sync set only once it holds all of it (starting at 0 let a
        # replica far behind join a new master's first set, and be appointed next).
        self.acknowledged_end = store.end_offset
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()
        self._deposed = False
        self._refused: list[str] | None = None  # the last set etcd refused, said once
        self._closed = threading.Event()
        self._data = threading.Condition()  # new data for the streams
        store.add_batch_listener(self._wake_streams)  # visible
        store.add_write_listener(self._wake_streams)  # written, not yet durable
        self._checker = threading.Thread(
            target=self._check_isr_forever, name="halfmoon-isr", daemon=True
        )

    def start(self) -> None:
        self._checker.start()

    def close(self) -> None:
        self._closed.set()
        with self._data:
            self._data.notify_all()
        if self._checker.is_alive():
            self._checker.join(5)
        self._fail_waiters(MasterDeposed("the broker is shutting down"))

    # -- acknowledgements ----------------------------------------------------------------

    def replicated(self, end: int, durable: Future[None]) -> Future[None]:
        """A future completing when a write ending at ``end`` may be acknowledged (see the
        module); ``durable`` is the master's own flush of it."""
        if self.settings.mode != "sync" and not self._deposed:
            return durable
        done: Future[None] = Future()
        refusal = self._refusal()
        if refusal is not None:
            done.set_exception(refusal)
            return done

        def local_done(flushed: Future[None]) -> None:
            error = flushed.exception()
            if error is not None:
                done.set_exception(error)
                return
            with self._lock:
                bisect.insort(self._waiters, _Waiter(end, next(self._seq), done))
                self._release_locked()

        durable.add_done_callback(local_done)
        return done

    def admit(self) -> None:
        """Refuse a send before it is written when a sync write could not be acknowledged."""
        if self.settings.mode == "sync" or self._deposed:
            refusal = self._refusal()
            if refusal is not None:
                raise refusal

    def _refusal(self) -> HalfmoonError | None:
        if self._deposed:
            return MasterDeposed(
                f"broker {self.member} is no longer the master of group {self.group} "
                f"(epoch {self.epoch}): retry, the group's master has changed"
            )
        if len(self.isr) < self.settings.min_insync:
            return NotEnoughReplicas(
                f"broker group {self.group} has {len(self.isr)} in-sync replicas "
                f"({', '.join(self.isr) or 'none'}), fewer than min_insync_replicas="
                f"{self.settings.min_insync}: nothing is acknowledged until replicas catch up"
            )
        return None

    def _committed_locked(self) -> int:
        """The end every in-sync replica holds (the master's end with no replica in the set)."""
        if not self.isr:
            return 1 << 62
        return min((self._replicas[n].acked for n in self.isr if n in self._replicas), default=0)

    def committed_offset(self) -> int:
        """The group's committed point (Kafka's high watermark): the end every in-sync replica
        holds, never past the master's visible end. Shipped to replicas, which serve reads
        only below it: a record above may still be cut by the next master."""
        with self._lock:
            committed = self._committed_locked()  # the master's end with an empty set
            if self.settings.mode == "sync":
                # Not past the last write acknowledged: one refused for want of in-sync
                # replicas (on every replica left in the set, but acknowledged to nobody)
                # stays unread until a later write is acknowledged after it.
                committed = min(committed, self.acknowledged_end)
        return min(committed, self.store.visible_offset)

    def _release_locked(self) -> None:
        if not self._waiters:
            return
        refusal = self._refusal()
        if refusal is not None:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                waiter.future.set_exception(refusal)
            return
        committed = self._committed_locked()
        released = 0
        for waiter in self._waiters:
            if waiter.end > committed:
                break
            released += 1
        if released:
            done = self._waiters[:released]
            del self._waiters[:released]
            self.acknowledged_end = max(self.acknowledged_end, done[-1].end)
            for waiter in done:
                waiter.future.set_result(None)

    def _fail_waiters(self, error: HalfmoonError) -> None:
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_exception(error)

    def depose(self) -> None:
        """The lease is gone: acknowledge nothing any more."""
        with self._lock:
            self._deposed = True
            self._release_locked()
        log.error("event=master_deposed group=%s epoch=%d", self.group, self.epoch)

    @property
    def deposed(self) -> bool:
        return self._deposed

    # -- progress and the in-sync set ------------------------------------------------------

    def connect(self, name: str, position: int) -> ReplicaProgress:
        """A replica's stream opened at ``position`` (its log's end)."""
        with self._lock:
            progress = self._replicas.setdefault(name, ReplicaProgress(name))
            progress.streams += 1
            progress.connected_ms = self._clock_ms()
            progress.acked = max(progress.acked, position)
        return progress

    def acknowledge(self, progress: ReplicaProgress, acked: int) -> None:
        """The replica holds everything below ``acked`` durably."""
        now = self._clock_ms()
        with self._lock:
            progress.acked = max(progress.acked, acked)
            if progress.acked >= progress.end_at_last_ack:
                progress.caught_up_ms = now
            progress.end_at_last_ack = self.store.visible_offset
            self._release_locked()
            self._lock.notify_all()  # wait_replica
        with self._data:
            self._data.notify_all()  # the window opened

    def wait_replica(self, name: str, timeout_s: float) -> int | None:
        """Wait until replica ``name`` holds the whole log (a fenced master's: it grows no
        more); the log's end then, or None after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                end = self.store.end_offset
                progress = self._replicas.get(name)
                if progress is not None and progress.streams > 0 and progress.acked >= end:
                    return end
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._lock.wait(min(remaining, 0.05))  # the log's end is not notified

    def acked(self, name: str) -> int:
        with self._lock:
            progress = self._replicas.get(name)
            return progress.acked if progress is not None else 0

    def _in_sync(self, progress: ReplicaProgress, now: int, end: int, joining: bool) -> bool:
        settings = self.settings
        if now - progress.caught_up_ms > settings.max_lag_ms:
            return False
        if end - progress.acked > settings.max_lag_bytes:
            return False
        return not joining or progress.acked >= self.acknowledged_end

    def desired_isr(self) -> list[str]:
        now = self._clock_ms()
        end = self.store.visible_offset
        with self._lock:
            return sorted(
                name
                for name, progress in self._replicas.items()
                if self._in_sync(progress, now, end, joining=name not in self.isr)
            )

    def check_isr(self) -> bool:
        """Publish and apply a changed in-sync set; whether it changed."""
        desired = self.desired_isr()
        if desired == self.isr or self._deposed:
            return False
        try:
            published = self._publish(desired)
        except Exception as exc:  # noqa: BLE001 - etcd away: keep the old set, try again
            log.warning("event=isr_publish_failed group=%s error=%s", self.group, exc)
            return False
        if not published:  # etcd no longer names this master: the set is not its to change
            if desired != self._refused:  # checked ten times a second: each refusal said once
                log.warning(
                    "event=isr_publish_refused group=%s epoch=%d isr=%s wanted=%s",
                    self.group, self.epoch, ",".join(self.isr), ",".join(desired),
                )  # fmt: skip
                self._refused = desired
            return False
        self._refused = None
        with self._lock:
            left = sorted(set(self.isr) - set(desired))
            joined = sorted(set(desired) - set(self.isr))
            self.isr = desired
            self._release_locked()
        log.info(
            "event=isr_changed group=%s epoch=%d isr=%s joined=%s left=%s",
            self.group, self.epoch, ",".join(desired), ",".join(joined), ",".join(left),
        )  # fmt: skip
        return True

    def _check_isr_forever(self) -> None:
        while not self._closed.wait(ISR_CHECK_S):
            try:
                self.check_isr()
            except Exception:
                log.exception("event=isr_check_failed group=%s", self.group)

    def status(self) -> dict[str, Any]:
        end = self.store.visible_offset
        now = self._clock_ms()

        def lag_ms(p: ReplicaProgress) -> int:
            return 0 if p.acked >= end else max(0, now - (p.caught_up_ms or p.connected_ms))

        with self._lock:
            replicas = {
                name: {
                    "acked": p.acked,
                    "lag_bytes": max(0, end - p.acked),
                    # How long since it last held the master's end (0 while it does): Kafka's
                    # replica lag time, the measure the in-sync rule uses.
                    "lag_ms": lag_ms(p),
                    "streams": p.streams,
                    "in_sync": name in self.isr,
                }
                for name, p in self._replicas.items()
            }
        return {
            "role": "master",
            "group": self.group,
            "member": self.member,
            "epoch": self.epoch,
            "end_offset": self.store.end_offset,
            "visible_offset": end,
            "mode": self.settings.mode,
            "min_insync_replicas": self.settings.min_insync,
            "isr": list(self.isr),
            "committed_offset": self.committed_offset(),
            "replicas": replicas,
            "epochs": self.epochs.entries,
            "deposed": self._deposed,
        }

    # -- the Stream ----------------------------------------------------------------------

    def _wake_streams(self, _result: object = None) -> None:
        with self._data:
            self._data.notify_all()

    def stream(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        try:
            hello = protocol.field(protocol.decode(next(requests)), "hello", dict)
            name = protocol.field(hello, "replica", str)
            position = self._opening(hello)
            window = max(protocol.MAX_CHUNK_BYTES, protocol.field(hello, "window", int))
        except StopIteration:
            return
        except HalfmoonError as error:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{error.code}: {error.message}")
        progress = self.connect(name, position)
        log.info("event=replica_connected group=%s replica=%s from=%d", self.group, name, position)
        reader = threading.Thread(
            target=self._read_acks, args=(progress, requests), name="halfmoon-replica-acks",
            daemon=True,
        )  # fmt: skip
        reader.start()
        try:
            yield protocol.encode(
                {"welcome": {"epoch": self.epoch, "epochs": self.epochs.entries, "from": position}}
            )
            yield from self._ship(progress, position, window, context, reader)
        finally:
            with self._lock:
                progress.streams -= 1
            log.info("event=replica_disconnected group=%s replica=%s", self.group, name)

    def epoch_end(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer ``EpochEnd``: where the asked epoch's part of this log ends (``epochs``)."""
        if protocol.field(request, "group", str) != self.group:
            raise ReplicationRefused(
                f"this master serves group {self.group}, not {request['group']}"
            )
        asked = protocol.field(request, "epoch", int)
        if asked > self.epoch:
            raise StaleEpoch(
                f"the member knows epoch {asked}, this master holds {self.epoch}: "
                "it has been replaced"
            )
        answered, end = self.epochs.end_of(asked, self.store.end_offset)
        return {"epoch": self.epoch, "answered": answered, "end": end}

    def _opening(self, hello: dict[str, Any]) -> int:
        if protocol.field(hello, "group", str) != self.group:
            raise ReplicationRefused(f"this master serves group {self.group}, not {hello['group']}")
        if protocol.field(hello, "epoch", int) > self.epoch:
            raise StaleEpoch(
                f"the replica knows epoch {hello['epoch']}, this master holds {self.epoch}: "
                "it has been replaced"
            )
        if protocol.field(hello, "segment_size", int) != self.store.segment_size:
            raise ReplicationRefused(
                f"the replica's segment size {hello['segment_size']} differs from the master's "
                f"{self.store.segment_size}: set the same store.segment_size on every member"
            )
        position = protocol.field(hello, "from", int)
        if position > self.store.end_offset:
            raise ReplicationRefused(
                f"the replica's log ends at {position}, past the master's {self.store.end_offset}: "
                "it holds writes this master never had and was not cut back (EpochEnd)"
            )
        minimum = self.store.stats().commit_log_min_offset
        if position == 0 and minimum > 0:
            position = minimum  # an empty replica starts where the retained log does
        elif position < minimum:
            raise ReplicationRefused(
                f"the replica's log ends at {position}, below the master's retained log "
                f"({minimum}): start the replica on an empty data directory"
            )
        return position

    def _ship(
        self,
        progress: ReplicaProgress,
        position: int,
        window: int,
        context: grpc.ServicerContext,
        reader: threading.Thread,
    ) -> Iterator[bytes]:
        last_sent = time.monotonic()
        told = -1  # the committed point this replica was last told
        while context.is_active() and reader.is_alive() and not self._closed.is_set():
            room = window - (position - progress.acked)
            data = b""
            if room > 0:
                try:
                    data = self.store.read_shipment(position, min(room, protocol.MAX_CHUNK_BYTES))
                except OffsetGone:
                    context.abort(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"{ReplicationRefused.code}: offset {position} left the master's log",
                    )
            committed = self.committed_offset()
            if data:
                yield protocol.encode(
                    {"epoch": self.epoch, "at": position, "data": data,
                     "end": self.store.visible_offset, "committed": committed}
                )  # fmt: skip
                position += len(data)
                last_sent, told = time.monotonic(), committed
                continue
            # With replica reads, a heartbeat also when the committed point moved: replicas
            # serving reads see an acknowledged write at once, not at the next idle heartbeat.
            # Without them it would be one more message per write, which nobody reads.
            moved = self.settings.replica_reads and committed != told
            if moved or time.monotonic() - last_sent >= IDLE_HEARTBEAT_S:
                yield protocol.encode(
                    {"epoch": self.epoch, "at": position, "data": b"",
                     "end": self.store.visible_offset, "committed": committed}
                )  # fmt: skip
                last_sent, told = time.monotonic(), committed
            with self._data:
                if self.settings.replica_reads and self.committed_offset() != told:
                    continue
                if self.store.end_offset <= position or position - progress.acked >= window:
                    self._data.wait(protocol.HEARTBEAT_S)

    def _read_acks(self, progress: ReplicaProgress, requests: Iterator[bytes]) -> None:
        try:
            for raw in requests:
                message = protocol.decode(raw)
                if protocol.field(message, "epoch", int) > self.epoch:
                    log.error("event=replica_knows_newer_epoch group=%s", self.group)
                    return
                self.acknowledge(progress, protocol.field(message, "acked", int))
        except Exception as exc:  # noqa: BLE001 - the stream ended, or the peer sent garbage
            log.debug("event=replica_acks_ended replica=%s error=%r", progress.name, exc)
        finally:
            with self._data:
                self._data.notify_all()
