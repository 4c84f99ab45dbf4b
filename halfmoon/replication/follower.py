"""The replica's side: fetch the master's log from this store's end, append, acknowledge.

One thread runs :meth:`Follower.run`: it asks ``find_master`` where the
group's master is (etcd's master key), opens a ``Stream`` to it, appends each
chunk with ``MessageStore.append_replicated`` (consume queues and key index
built by recovery's own dispatch), waits until the chunk is durable under the
replica's flush policy, and acknowledges it; an acknowledgement also goes out
every ``HEARTBEAT_S`` while idle, which is how the master knows the replica is
alive and caught up. Every ``MASTER_CHECK_S`` the replica also asks etcd
whether its master still is one, and leaves a master etcd no longer names.
On any failure (master gone, stream broken, refused) it waits and starts
over from its log's end: a replica restarted after a crash resumes where its
own recovery left its log. The wait is ``FIRST_RETRY_S`` for
``FAST_RETRIES_FOR_S`` after etcd names another master or the replica is
told to look now (:meth:`Follower.look_now`: a controller that just
appointed a master tells every member), then doubles up to ``RETRY_S`` while
nothing changes: a new master has no in-sync replica, and takes no sync
write, until one follows it.

Epochs: the replica knows the newest epoch it has seen (its epoch table's, or
the master key's). It refuses a master, or a chunk, of an older epoch, and
records the master's epoch entries as its log reaches their start offsets.

Divergence: before each stream the replica asks the master (``EpochEnd``)
where the newest epoch of its own table ends in the master's log, and cuts
its own log there if it holds more (``epochs.divergence``; a deposed master's
unreplicated tail), repeating until nothing is left to cut. Order of the cut,
each step safe to crash after: the epoch table first (a member with fewer
epochs campaigns less, never more), then ``on_truncate`` (the broker's
snapshots derived from the log), then the store (``MessageStore.truncate``,
itself restartable). A crash in between leaves a log that is still ahead,
and the next start asks again and cuts the same.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from halfmoon.cluster.internal.internal_tls import PLAINTEXT, InternalTls
from halfmoon.errors import HalfmoonError
from halfmoon.replication import protocol
from halfmoon.replication.coordination import MasterRecord
from halfmoon.replication.epochs import EpochTable, divergence
from halfmoon.replication.protocol import ReplicationRefused, StaleEpoch
from halfmoon.store.store import MessageStore

log = logging.getLogger("halfmoon.replication")

FIRST_RETRY_S = 0.05
# A master just named may still be taking office (refusing streams) for a moment: retried every
# FIRST_RETRY_S for this long after a change, then less and less often.
FAST_RETRIES_FOR_S = 1.0
RETRY_S = 0.5
MASTER_CHECK_S = 1.0  # how often a streaming replica asks etcd whether its master still is
STREAM_DEADLINE_S = 3600.0
EPOCH_END_TIMEOUT_S = 10.0
MAX_CUT_ROUNDS = 64  # each round cuts or ends; more would mean a master answering nonsense


class Follower:
    def __init__(
        self,
        store: MessageStore,
        group: str,
        member: str,
        epochs: EpochTable,
        find_master: Callable[[], MasterRecord | None],
        *,
        window: int = protocol.DEFAULT_WINDOW_BYTES,
        acknowledged: int = 0,
        on_truncate: Callable[[int], None] | None = None,
        tls: InternalTls = PLAINTEXT,
    ) -> None:
        self.store = store
        self._tls = tls  # towards the master
        self.group = group
        self.member = member
        self.epochs = epochs
        self._find_master = find_master
        self._window = window
        # What this member knows was acknowledged under sync (as master, before it was
        # deposed): a cut below it would lose acknowledged writes (logged, see _cut_diverged).
        self.acknowledged = acknowledged
        self._on_truncate = on_truncate
        self.truncated_to: int | None = None  # where the last cut left the log
        self.known_epoch = epochs.latest
        self.master: MasterRecord | None = None
        self.master_end = 0
        # The group's committed point as the master last told it (see ``committed_offset``).
        self._committed = 0
        self._committed_moved = threading.Condition()
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._look = threading.Event()  # ends the wait between attempts (look_now, close)
        self._call: Any = None
        self._pending_epochs: list[tuple[int, int]] = []
        self._thread = threading.Thread(target=self.run, name="halfmoon-follower", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def look_now(self) -> None:
        """Ask etcd for the master now rather than after the wait between attempts."""
        self._look.set()

    def close(self) -> None:
        self._stop.set()
        self._look.set()
        call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(10)

    @property
    def committed_offset(self) -> int:
        """Where reads served by this replica stop: the group's committed point (what every
        in-sync replica holds, as the master last said), never past this log's end. A record
        above it may be cut when a master that never had it takes office."""
        return min(self._committed, self.store.end_offset)

    def wait_committed(self, past: int, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` until the committed point passes ``past``; the point."""
        deadline = time.monotonic() + timeout_s
        with self._committed_moved:
            while self.committed_offset <= past:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._committed_moved.wait(remaining)
        return self.committed_offset

    def status(self) -> dict[str, Any]:
        master = self.master
        return {
            "role": "replica",
            "group": self.group,
            "member": self.member,
            "epoch": self.known_epoch,
            "end_offset": self.store.end_offset,
            "visible_offset": self.store.visible_offset,
            "master": master.member if master else None,
            "master_end": self.master_end,
            "committed_offset": self.committed_offset,
            "connected": self.connected.is_set(),
            "epochs": self.epochs.entries,
            "truncated_to": self.truncated_to,
        }

    def run(self) -> None:
        delay, tried, changed_at = FIRST_RETRY_S, None, time.monotonic()
        while not self._stop.is_set():
            try:
                master = self._find_master()
                if master != tried:
                    delay, tried, changed_at = FIRST_RETRY_S, master, time.monotonic()
                if master is not None and master.epoch >= self.known_epoch:
                    self.master = master
                    self.known_epoch = master.epoch
                    self._follow(master)
            except HalfmoonError as error:
                log.warning(
                    "event=replication_failed group=%s code=%s error=%s",
                    self.group, error.code, error.message,
                )  # fmt: skip
            except grpc.RpcError as error:
                if not self._stop.is_set():
                    log.info(
                        "event=replication_stream_ended group=%s status=%s details=%s",
                        self.group, error.code(), error.details(),
                    )  # fmt: skip
            except Exception:
                log.exception("event=replication_crashed group=%s", self.group)
            finally:
                if self.connected.is_set():
                    delay = FIRST_RETRY_S  # it streamed: its master has just gone
                self.connected.clear()
            if self._look.wait(delay):
                self._look.clear()
                delay, changed_at = FIRST_RETRY_S, time.monotonic()
            elif time.monotonic() - changed_at >= FAST_RETRIES_FOR_S:
                delay = min(delay * 2, RETRY_S)

    def _follow(self, master: MasterRecord) -> None:
        outgoing: queue.Queue[bytes | None] = queue.Queue()
        channel = self._tls.channel(  # mutual TLS when the cluster's internal CA is set
            master.endpoint,
            [
                ("grpc.max_receive_message_length", protocol.MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", protocol.MAX_MESSAGE_BYTES),
                ("grpc.keepalive_time_ms", 5_000),
                ("grpc.keepalive_timeout_ms", 2_000),
                ("grpc.keepalive_permit_without_calls", 1),
            ],
        )
        stop_heartbeat = threading.Event()
        try:
            self._cut_diverged(channel)
            outgoing.put(self._hello())
            method = channel.stream_stream(protocol.STREAM)
            self._call = call = method(_drain(outgoing), timeout=STREAM_DEADLINE_S)
            heartbeat = threading.Thread(
                target=self._heartbeat, args=(outgoing, stop_heartbeat), daemon=True
            )
            heartbeat.start()
            for raw in call:
                if self._stop.is_set():
                    break
                message = protocol.decode(raw)
                if "welcome" in message:
                    self._welcome(protocol.field(message, "welcome", dict))
                    # Acknowledged at once rather than at the first heartbeat: a master just
                    # in office takes no sync write until a replica is in sync.
                    outgoing.put(self._heartbeat_ack())
                    continue
                self._apply(message, outgoing)
        finally:
            stop_heartbeat.set()
            outgoing.put(None)
            self._call = None
            channel.close()

    def _hello(self) -> bytes:
        return protocol.encode(
            {"hello": {"group": self.group, "replica": self.member,
                       "epoch": self.known_epoch, "from": self.store.end_offset,
                       "window": self._window, "segment_size": self.store.segment_size}}
        )  # fmt: skip

    def _cut_diverged(self, channel: grpc.Channel) -> None:
        """Cut this log back to where it and the master's part (see the module)."""
        ask = channel.unary_unary(protocol.EPOCH_END)
        for _ in range(MAX_CUT_ROUNDS):
            asked, own_end = self.epochs.latest, self.store.end_offset
            if asked == 0 or own_end <= self.store.stats().commit_log_min_offset:
                return  # no epoch to compare, or nothing to cut
            request = {"group": self.group, "replica": self.member, "epoch": asked}
            answer = protocol.decode(ask(protocol.encode(request), timeout=EPOCH_END_TIMEOUT_S))
            master_epoch = protocol.field(answer, "epoch", int)
            if master_epoch < self.known_epoch:
                raise StaleEpoch(
                    f"a master of epoch {master_epoch}; this replica knows {self.known_epoch}"
                )
            answered = protocol.field(answer, "answered", int)
            end = protocol.field(answer, "end", int)
            cut = divergence(self.epochs.entries, own_end, asked, answered, end)
            if end < 0:
                log.warning(
                    "event=divergence_unknown group=%s asked_epoch=%d master_epoch=%d",
                    self.group, asked, master_epoch,
                )  # fmt: skip
                return
            self.epochs.truncate(answered, cut)  # the epochs the master never had go
            if cut >= own_end:
                return
            if cut < self.acknowledged:
                # By construction the new master holds every write acknowledged under sync
                # (it was in the in-sync set): only an unclean election gets here.
                log.error(
                    "event=truncation_below_acknowledged group=%s cut=%d acknowledged=%d",
                    self.group, cut, self.acknowledged,
                )  # fmt: skip
            log.warning(
                "event=replica_truncating group=%s asked_epoch=%d answered_epoch=%d "
                "master_end=%d from=%d to=%d bytes=%d",
                self.group, asked, answered, end, own_end, cut, own_end - cut,
            )  # fmt: skip
            if self._on_truncate is not None:
                self._on_truncate(cut)
            self._committed = min(self._committed, cut)
            self.store.truncate(cut)
            self.truncated_to = cut
        raise ReplicationRefused(
            f"no agreement with the master on where the logs part after {MAX_CUT_ROUNDS} rounds"
        )

    def _welcome(self, welcome: dict[str, Any]) -> None:
        epoch = protocol.field(welcome, "epoch", int)
        if epoch < self.known_epoch:
            raise StaleEpoch(f"a master of epoch {epoch}; this replica knows {self.known_epoch}")
        self.known_epoch = epoch
        entries = protocol.field(welcome, "epochs", list)
        self._pending_epochs = sorted(
            (int(e), int(s)) for e, s in entries if int(e) > self.epochs.latest
        )
        self._record_epochs()
        self.connected.set()
        log.info(
            "event=replica_following group=%s master=%s epoch=%d from=%d",
            self.group, self.master.member if self.master else "?", epoch, self.store.end_offset,
        )  # fmt: skip

    def _apply(self, message: dict[str, Any], outgoing: queue.Queue[bytes | None]) -> None:
        epoch = protocol.field(message, "epoch", int)
        if epoch < self.known_epoch:
            raise StaleEpoch(f"data of epoch {epoch}; this replica knows {self.known_epoch}")
        at = protocol.field(message, "at", int)
        data = protocol.field(message, "data", bytes)
        self.master_end = protocol.field(message, "end", int)
        committed = message.get("committed")
        if isinstance(committed, int) and not isinstance(committed, bool):
            # As told, not the highest ever told: the in-sync set may have changed.
            with self._committed_moved:
                self._committed = committed
                self._committed_moved.notify_all()
        if not data:
            return
        results = self.store.append_replicated(at, data)
        end = at + len(data)
        if results:
            # Not pipelined on purpose: while this fsync runs the master gathers more, so
            # the next chunk is bigger. Acknowledging each chunk as its fsync completed (and
            # applying the next meanwhile) cost the master 40 µs and each replica 15 µs more
            # per message with single-message sends (bench/replication_bench.py).
            self.store.wait_durable(end)
        self._record_epochs()
        with self._committed_moved:  # the point is clamped by this log's end, which moved
            self._committed_moved.notify_all()
        outgoing.put(protocol.encode({"epoch": self.known_epoch, "acked": end}))

    def _record_epochs(self) -> None:
        end = self.store.end_offset
        while self._pending_epochs and self._pending_epochs[0][1] <= end:
            epoch, start = self._pending_epochs.pop(0)
            self.epochs.record(epoch, start)

    def _heartbeat(self, outgoing: queue.Queue[bytes | None], stop: threading.Event) -> None:
        checked = time.monotonic()
        while not stop.wait(protocol.HEARTBEAT_S):
            with contextlib.suppress(Exception):
                outgoing.put(self._heartbeat_ack())
            if time.monotonic() - checked >= MASTER_CHECK_S:
                checked = time.monotonic()
                self._check_master()

    def _heartbeat_ack(self) -> bytes:
        return protocol.encode({"epoch": self.known_epoch, "acked": self.store.visible_offset})

    def _check_master(self) -> None:
        """Leave a master that etcd no longer names (a newer epoch elsewhere, or none)."""
        try:
            current = self._find_master()
        except Exception:  # noqa: BLE001 - etcd away: keep following, the master may be fine
            return
        following = self.master
        if following is None or current == following:
            return
        if current is not None and current.epoch < self.known_epoch:
            return
        log.warning(
            "event=master_changed group=%s was=%s now=%s",
            self.group, following.member, current.member if current else None,
        )  # fmt: skip
        call = self._call
        if call is not None:
            call.cancel()


def _drain(outgoing: queue.Queue[bytes | None]) -> Iterator[bytes]:
    while True:
        item = outgoing.get()
        if item is None:
            return
        yield item
