"""Live clients: who is connected, what they asked for, and the channel back to them.

Every official client opens one bidirectional ``Telemetry`` stream per
endpoint and sends its Settings on it; it then blocks (push consumers) until
the server answers with the settings it must use. The same stream is the only
way the server can reach a client unprompted, e.g. to ask a producer about an
orphaned transaction (``RecoverOrphanedTransactionCommand``).

:class:`ClientRegistry` keeps one :class:`ClientSession` per client id (from
the ``x-mq-client-id`` header), indexed by producer topic and group, with an
outbox queue drained by that client's stream. Heartbeats and sends refresh a
session; NotifyClientTermination or the stream's end forgets the stream. All
methods run on the event loop thread except the ``*_threadsafe`` ones, which
any thread (the broker's tick thread, say) may call.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from rocketmq.grpc_protocol import definition_pb2, service_pb2

from halfmoon.broker.stats import RateCounter
from halfmoon.server.client_commands import PendingReplies

log = logging.getLogger("halfmoon.server.telemetry")

ClientType = definition_pb2.ClientType
PRODUCER_TYPES = frozenset({ClientType.PRODUCER})
CONSUMER_TYPES = frozenset(
    {
        ClientType.PUSH_CONSUMER,
        ClientType.SIMPLE_CONSUMER,
        ClientType.PULL_CONSUMER,
        ClientType.LITE_PUSH_CONSUMER,
        ClientType.LITE_SIMPLE_CONSUMER,
    }
)
# A client that has neither heartbeated nor held a stream for this long is forgotten.
SESSION_IDLE_SECONDS = 300.0
# A client whose telemetry stream ended and that has not been heard from since is no
# longer listed at once (a SIGKILLed client's socket closes, which ends its stream);
# its session is kept this long for the calls it may still have in flight, then dropped.
STREAM_ENDED_GRACE_SECONDS = 30.0


@dataclass(eq=False)
class ClientSession:
    client_id: str
    client_type: int = ClientType.CLIENT_TYPE_UNSPECIFIED
    group: str | None = None  # consumer group, or producer group when a client sends one
    topics: set[str] = field(default_factory=set)  # published to / subscribed to
    settings: definition_pb2.Settings | None = None
    peer: str = ""
    language: str = ""
    version: str = ""
    last_seen: float = field(default_factory=time.monotonic)
    # When its last telemetry stream ended (None: it holds one, or never had one).
    stream_ended: float | None = None
    # Messages it sent, with their rate over the last minute (made at its first send).
    sent: RateCounter | None = field(default=None, repr=False)
    outbox: asyncio.Queue[service_pb2.TelemetryCommand | None] | None = None
    # Topics the stream's authenticated user may Pub on (None: any, authentication off);
    # transaction checks of other topics never reach this producer.
    may_publish: Callable[[str], bool] | None = field(default=None, repr=False)

    @property
    def is_producer(self) -> bool:
        return self.client_type in PRODUCER_TYPES

    @property
    def has_stream(self) -> bool:
        return self.outbox is not None

    @property
    def connected(self) -> bool:
        """Listed as connected: it holds a stream, never had one (a client without
        telemetry, kept by its heartbeats), or was heard from after its stream ended (a
        live client between two streams). An official client always holds a stream, so
        one whose stream ended and that fell silent is gone."""
        return self.stream_ended is None or self.last_seen > self.stream_ended

    def subscriptions(self) -> list[dict[str, str]]:
        """What the client said it subscribes to (topic and filter), from its settings; the
        topics it touched, unfiltered, when its settings name none."""
        subs = []
        if self.settings is not None and self.settings.HasField("subscription"):
            for entry in self.settings.subscription.subscriptions:
                kind = {1: "tag", 2: "sql92"}.get(int(entry.expression.type), "tag")
                subs.append(
                    {
                        "topic": entry.topic.name,
                        "filter_type": kind,
                        "filter": entry.expression.expression or "*",
                    }
                )
        if not subs:
            subs = [{"topic": t, "filter_type": "tag", "filter": "*"} for t in sorted(self.topics)]
        return subs

    def listing(self) -> dict[str, Any]:
        """:meth:`describe`, what listings filter on (``LISTING_FIELDS``: the admin API's
        producer and consumer listings, here or published for other proxy workers) and
        the subscriptions."""
        info: dict[str, Any] = dict(self.describe())
        allowed = self.may_publish
        info["is_producer"] = self.is_producer
        info["is_consumer"] = self.client_type in CONSUMER_TYPES
        # The topics it is listed as a producer of (checks never reach it for the others).
        info["publishes"] = sorted(t for t in self.topics if allowed is None or allowed(t))
        info["subscriptions"] = self.subscriptions()
        return info

    def describe(self) -> dict[str, object]:
        """A JSON-ready summary (admin API, logs)."""
        return {
            "client_id": self.client_id,
            "client_type": ClientType.Name(self.client_type)
            if self.client_type in ClientType.values()
            else str(self.client_type),
            "group": self.group,
            "topics": sorted(self.topics),
            "peer": self.peer,
            "language": self.language,
            "version": self.version,
            "stream": self.has_stream,
            "idle_seconds": round(time.monotonic() - self.last_seen, 3),
            "messages_sent": self.sent.total if self.sent is not None else 0,
            "send_rate": round(self.sent.per_second(), 3) if self.sent is not None else 0.0,
        }


# Fields of a session's listing that are for choosing, not for showing.
LISTING_FIELDS = ("is_producer", "is_consumer", "publishes")


def consumers_of(sessions: list[dict[str, Any]], group: str) -> list[dict[str, Any]]:
    """The consumers of ``group`` among listed sessions (:meth:`ClientSession.listing`)."""
    return [s for s in sessions if s.get("is_consumer") and s.get("group") == group]


def producers_of(
    sessions: list[dict[str, Any]], topic: str | None, group: str | None
) -> list[dict[str, Any]]:
    """Producers with a live stream that published to ``topic`` / belong to ``group``, as
    :meth:`ClientRegistry.producers` chooses them, among listed sessions."""
    return [
        s
        for s in sessions
        if s.get("is_producer")
        and s.get("stream")
        and (topic is None or topic in s.get("publishes", ()))
        and (group is None or s.get("group") == group)
    ]


class ClientRegistry:
    def __init__(self) -> None:
        self._sessions: dict[str, ClientSession] = {}
        # Commands sent to clients that wait for their reply (consumeMessageDirectly).
        self.replies = PendingReplies()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._round_robin = itertools.count()
        self._closed = False

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    # -- session lifecycle ------------------------------------------------------

    def touch(
        self,
        client_id: str,
        *,
        client_type: int | None = None,
        group: str | None = None,
        peer: str = "",
    ) -> ClientSession:
        """The client's session (created on first sight), marked alive now."""
        session = self._sessions.get(client_id)
        if session is None:
            session = ClientSession(client_id)
            self._sessions[client_id] = session
        if client_type:
            session.client_type = client_type
        if group:
            session.group = group
        if peer:
            session.peer = peer
        session.last_seen = time.monotonic()
        return session

    def open_stream(self, client_id: str, peer: str = "") -> tuple[ClientSession, asyncio.Queue]:
        """Attach a new telemetry stream; a previous stream of the same client is ended."""
        session = self.touch(client_id, peer=peer)
        if session.outbox is not None:
            session.outbox.put_nowait(None)
        outbox: asyncio.Queue[service_pb2.TelemetryCommand | None] = asyncio.Queue()
        session.outbox = outbox
        session.stream_ended = None
        log.info("event=telemetry_open client_id=%s peer=%s", client_id, peer)
        return session, outbox

    def close_stream(self, session: ClientSession, outbox: asyncio.Queue) -> None:
        if session.outbox is outbox:
            session.outbox = None
            session.stream_ended = time.monotonic()
            log.info("event=telemetry_close client_id=%s", session.client_id)

    def apply_settings(self, session: ClientSession, settings: definition_pb2.Settings) -> None:
        """Record what the client told us about itself in its Settings."""
        session.settings = settings
        if settings.HasField("client_type"):
            session.client_type = settings.client_type
        session.language = (
            definition_pb2.Language.Name(settings.user_agent.language)
            if settings.user_agent.language in definition_pb2.Language.values()
            else ""
        )
        session.version = settings.user_agent.version
        if settings.HasField("publishing"):
            session.topics.update(r.name for r in settings.publishing.topics if r.name)
        elif settings.HasField("subscription"):
            if settings.subscription.group.name:
                session.group = settings.subscription.group.name
            session.topics = {
                e.topic.name for e in settings.subscription.subscriptions if e.topic.name
            }

    def note_topic(self, client_id: str, topic: str, messages: int = 0) -> None:
        """A client sent ``messages`` to ``topic``: it becomes a candidate for that topic's
        commands, and the messages count in its send rate."""
        if not client_id:
            return
        session = self._sessions.get(client_id)
        if session is None:
            session = self.touch(client_id, client_type=ClientType.PRODUCER)
        session.topics.add(topic)
        session.last_seen = time.monotonic()
        if messages:
            if session.sent is None:
                session.sent = RateCounter(lambda: time.monotonic_ns() // 1_000_000)
            session.sent.add(messages)

    def remove(self, client_id: str) -> None:
        """The client said goodbye (NotifyClientTermination)."""
        session = self._sessions.pop(client_id, None)
        if session is not None and session.outbox is not None:
            session.outbox.put_nowait(None)
            session.outbox = None

    def expire_idle(
        self,
        idle_seconds: float = SESSION_IDLE_SECONDS,
        ended_grace: float = STREAM_ENDED_GRACE_SECONDS,
    ) -> int:
        now = time.monotonic()
        stale = [
            cid
            for cid, s in self._sessions.items()
            if s.outbox is None
            and (
                now - s.last_seen > idle_seconds
                or (not s.connected and now - (s.stream_ended or now) > ended_grace)
            )
        ]
        for cid in stale:
            del self._sessions[cid]
        return len(stale)

    def close_all(self) -> None:
        """End every telemetry stream (shutdown): their RPCs complete normally."""
        self._closed = True
        for session in self._sessions.values():
            if session.outbox is not None:
                session.outbox.put_nowait(None)
                session.outbox = None

    # -- lookups ------------------------------------------------------------------

    def get(self, client_id: str) -> ClientSession | None:
        return self._sessions.get(client_id)

    def sessions(self) -> list[ClientSession]:
        """The connected clients (:attr:`ClientSession.connected`): what the admin API
        lists and counts and the metrics export. :meth:`get` still finds the others."""
        return [s for s in list(self._sessions.values()) if s.connected]

    def producers(
        self, *, topic: str | None = None, group: str | None = None
    ) -> list[ClientSession]:
        """Producers with a live stream that published to ``topic`` / belong to ``group``.

        Any thread: the sessions are copied first (one C call, so no other thread's change
        can break the iteration); a session's fields may be a moment stale.
        """
        found = []
        for session in list(self._sessions.values()):
            if not session.is_producer or session.outbox is None:
                continue
            if topic is not None and topic not in session.topics:
                continue
            allowed = session.may_publish
            if topic is not None and allowed is not None and not allowed(topic):
                continue
            if group is not None and session.group != group:
                continue
            found.append(session)
        return found

    def consumers(self, group: str) -> list[ClientSession]:
        return [
            s
            for s in self._sessions.values()
            if s.group == group and s.client_type in CONSUMER_TYPES
        ]

    # -- commands to clients ----------------------------------------------------

    def send_command(self, client_id: str, command: service_pb2.TelemetryCommand) -> bool:
        """Queue ``command`` on the client's stream; False when it has no live stream."""
        session = self._sessions.get(client_id)
        if session is None or session.outbox is None:
            return False
        session.outbox.put_nowait(command)
        return True

    def send_to_producer(
        self,
        command: service_pb2.TelemetryCommand,
        *,
        topic: str | None = None,
        group: str | None = None,
    ) -> str | None:
        """Send ``command`` to one live producer of ``topic``/``group`` (rotating); its client id,
        or None."""
        candidates = self.producers(topic=topic, group=group)
        if not candidates:
            return None
        session = candidates[next(self._round_robin) % len(candidates)]
        session.outbox.put_nowait(command)  # type: ignore[union-attr]
        return session.client_id

    def send_to_producer_threadsafe(
        self,
        command: service_pb2.TelemetryCommand,
        *,
        topic: str | None = None,
        group: str | None = None,
    ) -> Future[str | None]:
        """:meth:`send_to_producer` from any thread; the future gives the chosen client id."""
        return self._run_threadsafe(
            lambda: self.send_to_producer(command, topic=topic, group=group)
        )

    def send_command_threadsafe(
        self, client_id: str, command: service_pb2.TelemetryCommand
    ) -> Future[bool]:
        """``send_command`` from any thread (lite unsubscribe notices come from broker calls)."""
        return self._run_threadsafe(lambda: self.send_command(client_id, command))

    def _run_threadsafe(self, fn: Callable[[], object]) -> Future:
        result: Future = Future()
        loop = self._loop
        if loop is None or loop.is_closed() or self._closed:
            result.set_result(None)
            return result

        def run() -> None:
            try:
                result.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                result.set_exception(exc)

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:  # loop closed meanwhile
            result.set_result(None)
        return result
