"""A proxy's connections to the cluster's brokers, and what it knows of each topic's layout.

One :class:`RemoteBroker` per live broker, opened when the broker appears in
the :class:`ClusterView` (so arrival wake-ups and transaction checks flow
from every broker before any client asks) and reopened when it re-registers
at another endpoint, or when a broker group's routing entry names another
epoch (a connection to a group's master is for one epoch, which its requests
carry: :mod:`halfmoon.cluster.internal.fencing`). Listeners a front end adds
(arrivals, check sender, lite notices) are installed on every connection,
present and future, with the broker's queue ids translated to the cluster's.

The view lives on the proxy's event loop; the facade's operations run on
worker threads. Reads of the view from a thread are plain dict reads; writes
to etcd are submitted to the loop (:meth:`BrokerPool.on_loop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from halfmoon.broker.errors import TopicExists
from halfmoon.broker.lite import UnsubscribeNotifier
from halfmoon.broker.message import MessageType
from halfmoon.broker.topics import is_reserved
from halfmoon.broker.transactions.check import CheckRequest, CheckSender
from halfmoon.cluster.coordination.metadata import ClusterMetadata
from halfmoon.cluster.coordination.view import ClusterView
from halfmoon.cluster.internal.fencing import group_epoch
from halfmoon.cluster.internal.internal_tls import PLAINTEXT, InternalTls
from halfmoon.cluster.internal.remote_broker import RemoteBroker
from halfmoon.cluster.internal.replica_reads import ReplicaReads
from halfmoon.cluster.internal.wire import BrokerUnavailable
from halfmoon.cluster.proxy.routing import Layout, qualify
from halfmoon.errors import HalfmoonError, NotFound

log = logging.getLogger("halfmoon.cluster.pool")

T = TypeVar("T")
METADATA_TIMEOUT_S = 10.0
# A broker listed in etcd whose handshake failed is tried again after FIRST_RETRY_S, then
# twice as long each time up to RECONNECT_S: a broker group's new master announces itself once
# it serves, and one that does not answer yet (the service registering, the port opening)
# costs its clients tens of milliseconds, not a second.
FIRST_RETRY_S = 0.05
RECONNECT_S = 1.0
WRITABLE_TTL_S = 1.0
# How often the pool asks every connected broker again (keep_writability_fresh): well inside
# the TTL, so a send planned on the event loop always finds every broker's answer fresh.
WRITABLE_REFRESH_S = WRITABLE_TTL_S / 4
# Asking a broker whether it is writable waits this long: a send waits on the answer.
WRITABLE_TIMEOUT_S = 2.0

# (endpoint, the group epoch the connection is for: None for a standalone broker) -> connection
Connect = Callable[[str, int | None], RemoteBroker]


class QualifyingCheckSender:
    """Hands a broker's transaction checks to the front end with cluster transaction ids."""

    def __init__(self, broker: str, sender: CheckSender) -> None:
        self.broker = broker
        self.sender = sender

    def send_checks(self, checks: Sequence[CheckRequest]) -> list[bool]:
        qualified = [
            CheckRequest(
                c.producer_group,
                c.topic,
                c.message,
                qualify(self.broker, c.transaction_id),
            )
            for c in checks
        ]
        return self.sender.send_checks(qualified)


class BrokerPool:
    def __init__(
        self,
        view: ClusterView,
        metadata: ClusterMetadata,
        loop: asyncio.AbstractEventLoop,
        *,
        connect: Connect | None = None,
        tls: InternalTls = PLAINTEXT,
    ) -> None:
        self.view = view
        self.metadata = metadata
        self.loop = loop
        self._connect = connect or (
            lambda target, epoch: RemoteBroker(target, epoch=epoch, tls=tls)
        )
        self._lock = threading.Lock()
        self._brokers: dict[str, tuple[str, RemoteBroker]] = {}  # name -> (endpoint, broker)
        self._arrival_listeners: list[Callable[[str, int], None]] = []
        self._watched_listeners: list[Callable[[str, int], None]] = []
        self._watched: set[str] = set()
        self._check_sender: CheckSender | None = None
        self._lite_notifier: UnsubscribeNotifier | None = None
        self._writable: dict[str, tuple[float, bool]] = {}  # name -> (asked at, writable)
        # Broker groups seen (a routing entry naming a member): one that is unreachable is
        # between masters, not drained, so its queues stay writable in routes (clients keep
        # them and retry; the controller's new master answers within seconds).
        self._groups: set[str] = set()
        self._unreachable: dict[str, str] = {}  # name -> the endpoint last reported unreachable
        # Pulls and bulk reads a group lets its in-sync replicas serve (--replica-reads).
        self.replica_reads = ReplicaReads(lambda: self.view.group_keys, tls)

    # -- connections ---------------------------------------------------------------------------

    def sync_connections(self) -> None:
        """Open a connection to every broker the view lists; close those of departed ones.

        A broker whose lease expired is forgotten: its queues are unavailable until it
        registers again. Runs on a worker thread (connecting blocks).
        """
        live = _endpoints(self.view)
        self._groups.update(n for n, r in self.view.brokers.items() if r.get("member"))
        with self._lock:
            gone = [
                n
                for n, (endpoint, b) in self._brokers.items()
                if live.get(n) != (endpoint, b.epoch)
            ]
            stale = [self._brokers.pop(n)[1] for n in gone]
            missing = {n: e for n, e in live.items() if n not in self._brokers}
        if stale:
            # Closed aside: closing waits for calls still in flight to a broker that may be
            # dead, and a broker group's new master must not wait for its old one to close.
            threading.Thread(
                target=_close_all, args=(stale,), name="halfmoon-broker-close", daemon=True
            ).start()
        for name, (endpoint, epoch) in missing.items():
            try:
                # A group's master is reached for the epoch its routing entry names: its
                # requests carry it, and a member of another epoch refuses them (fencing.py).
                remote = self._connect(endpoint, epoch)
            except HalfmoonError as error:
                # Said once per endpoint: it is tried again within milliseconds.
                if self._unreachable.get(name) != endpoint:
                    self._unreachable[name] = endpoint
                    log.warning(
                        "event=broker_unreachable broker=%s endpoint=%s %s", name, endpoint, error
                    )
                continue
            self._unreachable.pop(name, None)
            self._install(name, remote)
            # Groups and topics first, routed to after: a broker group's new master lacks the
            # old one's topic table, and a send reaching it before would fail as an unknown
            # topic (which clients do not retry) instead of an unreachable broker (retried).
            self._sync_groups(remote)
            self._sync_topics(name, remote)
            with self._lock:
                self._brokers[name] = (endpoint, remote)
            log.info("event=broker_connected broker=%s endpoint=%s", name, endpoint)

    async def follow_view(self) -> None:
        """Keep the connections in step with the view until cancelled."""
        delay, tried = FIRST_RETRY_S, None
        while True:
            await self.loop.run_in_executor(None, self.sync_connections)
            known, listed = self._connected_endpoints(), _endpoints(self.view)
            if listed == known:
                delay, tried = FIRST_RETRY_S, None
                wait_s = RECONNECT_S * 10
            else:
                # A broker listed but not reachable: again soon after the view changed, less
                # often while it stays so; at once when the view changes again.
                if listed != tried:
                    delay, tried = FIRST_RETRY_S, listed
                wait_s, delay = delay, min(delay * 2, RECONNECT_S)
            with contextlib.suppress(TimeoutError):
                await self.view.wait_for(
                    lambda view, seen=listed: _endpoints(view) != seen,  # type: ignore[misc]
                    wait_s,
                )

    def _connected_endpoints(self) -> dict[str, tuple[str, int | None]]:
        with self._lock:
            return {n: (e, b.epoch) for n, (e, b) in self._brokers.items()}

    def _install(self, name: str, remote: RemoteBroker) -> None:
        remote.watch_arrivals(sorted(self._watched))
        for listener in list(self._arrival_listeners):
            remote.add_arrival_listener(self._translating(name, listener))
        for listener in list(self._watched_listeners):
            remote.add_watched_arrival_listener(self._translating(name, listener))
        if self._check_sender is not None:
            remote.set_check_sender(QualifyingCheckSender(name, self._check_sender))
        if self._lite_notifier is not None:
            remote.set_lite_unsubscribe_notifier(self._lite_notifier)

    def _sync_groups(self, remote: RemoteBroker) -> None:
        """A broker that joined (or came back) learns the cluster's groups it lacks."""
        for group in self.view.groups.values():
            try:
                if remote.find_group(group.name) is None:
                    remote.create_group(
                        group.name,
                        fifo=group.fifo,
                        max_delivery_attempts=group.max_delivery_attempts,
                        retry_policy=group.retry_policy,
                        consume_from=group.consume_from,
                        consume_enabled=group.consume_enabled,
                        broadcast=group.broadcast,
                    )
            except HalfmoonError as error:
                log.warning("event=group_sync_failed group=%s %s", group.name, error)

    def _sync_topics(self, name: str, remote: RemoteBroker) -> None:
        """A broker that joined learns the topics etcd places on it that it lacks: a broker
        group's new master has the log's messages but not the old master's topic table."""
        for topic in self.view.topics.values():
            share = len(topic.queues_on(name))
            if not share:
                continue
            try:
                if remote.find_topic(topic.name) is None:
                    with contextlib.suppress(TopicExists):
                        remote.create_topic(
                            topic.name, MessageType(topic.message_type), share, topic.perm
                        )
            except HalfmoonError as error:
                log.warning("event=topic_sync_failed topic=%s %s", topic.name, error)

    def _translating(
        self, name: str, listener: Callable[[str, int], None]
    ) -> Callable[[str, int], None]:
        def on_arrival(topic: str, broker_queue: int) -> None:
            listener(topic, self.layout(topic, probe=False).cluster_queue(name, broker_queue))

        return on_arrival

    def broker(self, name: str) -> RemoteBroker:
        with self._lock:
            entry = self._brokers.get(name)
        if entry is None:
            raise BrokerUnavailable(f"broker {name!r} is not reachable (not registered or down)")
        return entry[1]

    def is_connected(self, name: str) -> bool:
        with self._lock:
            return name in self._brokers

    def is_reachable(self, name: str) -> bool:
        """Connected, and not found unreachable in the last second (a broker SIGKILLed
        before its lease expired: connection refused): worth sending to or reading from."""
        with self._lock:
            entry = self._brokers.get(name)
        return entry is not None and not entry[1].suspect()

    def is_writable(self, name: str) -> bool:
        """Whether the broker takes new messages (``cluster write-perm --wipe`` drains it);
        asked at most once a second per broker, so sends do not pay a round trip each."""
        cached = self._writable.get(name)
        if cached is not None and time.monotonic() - cached[0] < WRITABLE_TTL_S:
            return cached[1]
        return self._ask_writable(name)

    def _ask_writable(self, name: str) -> bool:
        now = time.monotonic()
        try:
            writable = self.broker(name).writable_within(WRITABLE_TIMEOUT_S)
        except HalfmoonError:
            writable = name in self._groups
        self._writable[name] = (now, writable)
        return writable

    async def keep_writability_fresh(self) -> None:
        """Ask every connected broker whether it is writable every ``WRITABLE_REFRESH_S``,
        until cancelled, each on a worker thread of its own (a broker slow to answer delays
        only its own answer). Sends planned on the event loop read these answers
        (:meth:`writable_known`): without them, a broker nobody sent to for a second would
        send the next send to a thread, and a broker never chosen would never be asked."""
        asking: dict[str, asyncio.Future[bool]] = {}
        while True:
            now = time.monotonic()
            for name in self.connected():
                if not self.is_reachable(name) or (name in asking and not asking[name].done()):
                    continue  # sends skip a broker found down a moment ago: no need to ask
                cached = self._writable.get(name)
                if cached is None or now - cached[0] >= WRITABLE_REFRESH_S:
                    asking[name] = self.loop.run_in_executor(None, self._ask_writable, name)
                    asking[name].add_done_callback(_log_refresh_failure)
            for name in [n for n in asking if asking[n].done()]:
                del asking[name]
            await asyncio.sleep(WRITABLE_REFRESH_S / 2)

    def writable_known(self, name: str) -> bool | None:
        """:meth:`is_writable` when it was asked less than a second ago, else None (never
        blocks: for the event loop)."""
        cached = self._writable.get(name)
        if cached is not None and time.monotonic() - cached[0] < WRITABLE_TTL_S:
            return cached[1]
        return None

    def connected(self) -> dict[str, RemoteBroker]:
        with self._lock:
            return {n: b for n, (_, b) in sorted(self._brokers.items())}

    def any_broker(self) -> RemoteBroker:
        for broker in self.connected().values():
            return broker
        raise BrokerUnavailable("no broker of the cluster is reachable")

    def close_connections(self) -> None:
        with self._lock:
            brokers = [b for _, b in self._brokers.values()]
            self._brokers.clear()
        for broker in brokers:
            broker.close()
        self.replica_reads.close()

    # -- listeners -----------------------------------------------------------------------------

    def add_arrival_listener(self, callback: Callable[[str, int], None]) -> None:
        self._arrival_listeners.append(callback)
        for name, broker in self.connected().items():
            broker.add_arrival_listener(self._translating(name, callback))

    def add_watched_arrival_listener(self, callback: Callable[[str, int], None]) -> None:
        self._watched_listeners.append(callback)
        for name, broker in self.connected().items():
            broker.add_watched_arrival_listener(self._translating(name, callback))

    def watch_arrivals(self, topics: Sequence[str]) -> None:
        """Arrivals of ``topics`` from every broker, present and future (never blocks)."""
        self._watched.update(topics)
        for broker in self.connected().values():
            broker.watch_arrivals(topics)

    def unwatch_arrivals(self, topics: Sequence[str]) -> None:
        self._watched.difference_update(topics)
        for broker in self.connected().values():
            broker.unwatch_arrivals(topics)

    def set_check_sender(self, sender: CheckSender | None) -> None:
        self._check_sender = sender
        for name, broker in self.connected().items():
            broker.set_check_sender(None if sender is None else QualifyingCheckSender(name, sender))

    def set_lite_unsubscribe_notifier(self, notifier: UnsubscribeNotifier | None) -> None:
        self._lite_notifier = notifier
        for broker in self.connected().values():
            broker.set_lite_unsubscribe_notifier(notifier)

    # -- layouts -------------------------------------------------------------------------------

    def layout(self, topic: str, *, probe: bool = True) -> Layout:
        """The topic's queues. A topic etcd does not place (a dead-letter topic a broker made)
        is laid out from the brokers' own topics when ``probe`` (an empty layout otherwise)."""
        placed = self.view.topic(topic)
        if placed is not None:
            return Layout(topic, placed.queues, placed.writable)
        if not probe:
            return Layout(topic, ())
        counts = []
        for name, broker in self.connected().items():
            found = broker.find_topic(topic)
            if found is not None:
                counts.append((name, found.read_queue_count))
        return Layout.end_to_end(topic, counts)

    def placed(self, topic: str) -> bool:
        return self.view.topic(topic) is not None or is_reserved(topic)

    # -- helpers -------------------------------------------------------------------------------

    def on_loop(self, coroutine: Coroutine[Any, Any, T], timeout: float = METADATA_TIMEOUT_S) -> T:
        """Run an etcd operation on the proxy's event loop from a worker thread."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def fan_out(
        self,
        brokers: Sequence[str],
        call: Callable[[RemoteBroker], T],
        *,
        skip_missing: bool = False,
    ) -> list[tuple[str, T]]:
        """``call`` on each named broker in turn; with ``skip_missing``, brokers that are down
        or do not know the thing asked about (NotFound) are left out instead of failing."""
        answers = []
        for name in brokers:
            try:
                answers.append((name, call(self.broker(name))))
            except (BrokerUnavailable, NotFound):
                if not skip_missing:
                    raise
        return answers


def _close_all(brokers: Sequence[RemoteBroker]) -> None:
    for broker in brokers:
        with contextlib.suppress(Exception):
            broker.close()


def _log_refresh_failure(future: asyncio.Future[bool]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("event=writable_refresh_failed error=%r", future.exception())


def _endpoints(view: ClusterView) -> dict[str, tuple[str, int | None]]:
    """Each live broker's endpoint and, for a broker group's master, the group's epoch."""
    return {
        name: (str(record.get("endpoint", "")), group_epoch(record))
        for name, record in view.brokers.items()
        if record.get("endpoint")
    }
