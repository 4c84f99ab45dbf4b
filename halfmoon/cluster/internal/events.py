"""The peer's end of the Events stream: arrivals, transaction checks, lite notices.

One stream per connection, open while anything listens, subscribed to what
is listened to (arrivals once a listener is added, checks while a check
sender is set, lite notices while a notifier is set). A thread reads it and
calls the local listeners; a check batch is handed to the local check
sender and its answer (which checks a live producer took) goes back on the
same stream. A stream that fails or reaches its deadline is reopened after
a short pause, with the handshake again (one cancelled to change what it
subscribes to, at once); wake-ups lost in the gap are
harmless (long polls also wake on their own timeout).

Listeners run on the stream's thread, shortly after the broker's append (a
network hop later than in-process); they must not block.

Arrival listeners come in two kinds: for every topic (``add_arrival_listener``,
the facade's) and for watched topics only (``add_watched_arrival_listener``, a
proxy's long polls). When only the second kind listens, the subscription names
the watched topics and the broker pushes arrivals of those alone; ``watch`` and
``unwatch`` change the set on the open stream (``["watch", [topic, ...]]``),
and the broker answers a new watch with one arrival per topic, so nothing that
arrived while the watch was on its way is missed.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc

from halfmoon.broker.lite import UnsubscribeNotifier
from halfmoon.broker.transactions import CheckSender
from halfmoon.broker.transactions.check import CheckRequest
from halfmoon.cluster.internal import wire
from halfmoon.cluster.internal.connection import BrokerConnection, rpc_error
from halfmoon.errors import HalfmoonError

log = logging.getLogger("halfmoon.cluster")

REOPEN_PAUSE_S = 0.2
SUBSCRIBE_WAIT_S = 5.0  # how long a new subscription waits for the broker to confirm it


class BrokerEvents:
    def __init__(self, connection: BrokerConnection, peer: str) -> None:
        self._connection = connection
        self._peer = peer
        self._lock = threading.Lock()
        self._arrival_listeners: list[Callable[[str, int], None]] = []
        self._watched_listeners: list[Callable[[str, int], None]] = []
        self._watched: set[str] = set()
        self._stream_watches = False  # the open stream's subscription names watched topics
        self._check_sender: CheckSender | None = None
        self._lite_notifier: UnsubscribeNotifier | None = None
        self._call: Any = None
        self._outgoing: queue.SimpleQueue[bytes | None] | None = None
        self._subscribed = threading.Event()
        # Set when the stream is cancelled to change its subscription: reopened at once (the
        # pause is for a stream that failed), so installing several listeners costs no pauses.
        self._reopen = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the facade sets ------------------------------------------------------------------

    def add_arrival_listener(self, callback: Callable[[str, int], None]) -> None:
        with self._lock:
            self._arrival_listeners.append(callback)
        self._resubscribe()

    def add_watched_arrival_listener(self, callback: Callable[[str, int], None]) -> None:
        with self._lock:
            self._watched_listeners.append(callback)
        self._resubscribe()

    def watch(self, topics: Iterable[str]) -> None:
        """Arrivals of ``topics`` from now on, for the watched-topic listeners (never blocks)."""
        with self._lock:
            new = sorted(set(topics) - self._watched)
            self._watched.update(new)
            if new and self._stream_watches and self._outgoing is not None:
                self._outgoing.put(wire.encode(["watch", new]))

    def unwatch(self, topics: Iterable[str]) -> None:
        with self._lock:
            gone = sorted(set(topics) & self._watched)
            self._watched.difference_update(gone)
            if gone and self._stream_watches and self._outgoing is not None:
                self._outgoing.put(wire.encode(["unwatch", gone]))

    def set_check_sender(self, sender: CheckSender | None) -> None:
        with self._lock:
            self._check_sender = sender
        self._resubscribe()

    def set_lite_unsubscribe_notifier(self, notifier: UnsubscribeNotifier | None) -> None:
        with self._lock:
            self._lite_notifier = notifier
        self._resubscribe()

    def close(self) -> None:
        self._closed.set()
        self._cancel()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- the stream ------------------------------------------------------------------------------

    def _kinds(self) -> list[str]:
        with self._lock:
            listening = self._arrival_listeners or self._watched_listeners
            kinds = ["arrivals"] if listening else []
            if self._check_sender is not None:
                kinds.append("checks")
            if self._lite_notifier is not None:
                kinds.append("lite")
            return kinds

    def _resubscribe(self) -> None:
        """Reopen the stream with the new subscription; wait (bounded) until the broker has it,
        so an event right after the call that subscribed is not missed."""
        self._subscribed.clear()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="halfmoon-broker-events", daemon=True
            )
            self._thread.start()
        else:
            self._reopen.set()
            self._cancel()
        if self._kinds():
            self._subscribed.wait(SUBSCRIBE_WAIT_S)

    def _cancel(self) -> None:
        with self._lock:
            call, outgoing = self._call, self._outgoing
        if outgoing is not None:
            outgoing.put(None)
        if call is not None:
            call.cancel()

    def _run(self) -> None:
        while not self._closed.is_set():
            kinds = self._kinds()
            if not kinds:
                self._closed.wait(REOPEN_PAUSE_S)
                continue
            try:
                self._stream(kinds)
            except HalfmoonError as error:
                if not self._closed.is_set() and not self._reopen.is_set():
                    log.info("event=broker_events_reopen reason=%s", error.code)
            except Exception:  # noqa: BLE001 - reopen; say why
                if not self._closed.is_set():
                    log.exception("event=broker_events_failed")
            if self._reopen.is_set():
                self._reopen.clear()
                continue
            self._closed.wait(REOPEN_PAUSE_S)

    def _stream(self, kinds: list[str]) -> None:
        outgoing: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        opening: dict[str, Any] = {"subscribe": kinds, "peer": self._peer}
        with self._lock:  # a watch lands in the opening or after it, never in between
            watches = not self._arrival_listeners and bool(self._watched_listeners)
            if watches:
                opening["watch"] = sorted(self._watched)
            outgoing.put(wire.encode(opening))
            self._outgoing, self._stream_watches = outgoing, watches

        def requests() -> Iterator[bytes]:
            while (item := outgoing.get()) is not None:
                yield item

        call = self._connection.events(requests())
        with self._lock:
            self._call = call
        try:
            for raw in call:
                for event in wire.decode(raw):
                    self._dispatch(event, outgoing)
        except grpc.RpcError as exc:
            raise rpc_error(exc, self._connection.target) from None
        finally:
            outgoing.put(None)
            with self._lock:
                if self._outgoing is outgoing:
                    self._call, self._outgoing = None, None

    def _dispatch(self, event: list[Any], outgoing: queue.SimpleQueue[bytes | None]) -> None:
        kind = event[0]
        if kind == "subscribed":
            self._subscribed.set()
        elif kind == "arrivals":
            with self._lock:
                listeners = list(self._arrival_listeners)
                watchers = list(self._watched_listeners)
                watched = self._watched
            for topic, queue_id in event[1]:
                called = listeners + watchers if topic in watched else listeners
                for listener in called:
                    try:
                        listener(topic, queue_id)
                    except Exception:  # noqa: BLE001 - one listener must not stop the others
                        log.exception("event=arrival_listener_failed")
        elif kind == "checks":
            _, batch_id, checks = event
            outgoing.put(wire.encode([batch_id, self._send_checks(checks)]))
        elif kind == "lite":
            with self._lock:
                notifier = self._lite_notifier
            if notifier is not None:
                try:
                    notifier(*event[1])
                except Exception:  # noqa: BLE001 - a notice lost is logged, not fatal
                    log.exception("event=lite_notifier_failed")

    def _send_checks(self, checks: list[CheckRequest]) -> list[bool]:
        with self._lock:
            sender = self._check_sender
        if sender is None:
            return [False] * len(checks)
        try:
            if hasattr(sender, "send_checks"):
                return [bool(took) for took in sender.send_checks(checks)]
            # The older per-message sender the broker's check service also accepts.
            send_check = getattr(sender, "send_check")  # noqa: B009 - not in the protocol
            return [
                bool(send_check(c.producer_group, c.topic, c.message, c.transaction_id))
                for c in checks
            ]
        except Exception:  # noqa: BLE001 - the broker counts the batch as unsent
            log.exception("event=check_sender_failed")
            return [False] * len(checks)
