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
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from rocketmq.grpc_protocol import definition_pb2, service_pb2

from halfmoon.broker.message import MessageView
from halfmoon.server.check_pacing import OutstandingChecks
from halfmoon.server.client_commands import PendingReplies
from halfmoon.server.convert import fill_wire_message

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
        log.info("event=telemetry_open client_id=%s peer=%s", client_id, peer)
        return session, outbox

    def close_stream(self, session: ClientSession, outbox: asyncio.Queue) -> None:
        if session.outbox is outbox:
            session.outbox = None
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

    def note_topic(self, client_id: str, topic: str) -> None:
        """A client sent to ``topic``: it becomes a candidate for that topic's commands."""
        if not client_id:
            return
        session = self._sessions.get(client_id)
        if session is None:
            session = self.touch(client_id, client_type=ClientType.PRODUCER)
        session.topics.add(topic)
        session.last_seen = time.monotonic()

    def remove(self, client_id: str) -> None:
        """The client said goodbye (NotifyClientTermination)."""
        session = self._sessions.pop(client_id, None)
        if session is not None and session.outbox is not None:
            session.outbox.put_nowait(None)
            session.outbox = None

    def expire_idle(self, idle_seconds: float = SESSION_IDLE_SECONDS) -> int:
        now = time.monotonic()
        stale = [
            cid
            for cid, s in self._sessions.items()
            if s.outbox is None and now - s.last_seen > idle_seconds
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
        return list(self._sessions.values())

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


def recover_orphaned_transaction_command(
    message: definition_pb2.Message, transaction_id: str
) -> service_pb2.TelemetryCommand:
    """The command that asks a producer to resolve a transaction it left open."""
    return service_pb2.TelemetryCommand(
        recover_orphaned_transaction_command=service_pb2.RecoverOrphanedTransactionCommand(
            message=message, transaction_id=transaction_id
        )
    )


def check_command(view: MessageView, transaction_id: str) -> service_pb2.TelemetryCommand:
    """:func:`recover_orphaned_transaction_command` for the half message ``view``, its wire
    message written in place (passing a built one in copies it, once per enclosing message)."""
    command = service_pb2.TelemetryCommand()
    recover = command.recover_orphaned_transaction_command
    recover.transaction_id = transaction_id
    fill_wire_message(recover.message, view)
    return command


class TelemetryCheckSender:
    """The broker's transaction CheckSender: asks a live producer over its telemetry stream.

    Candidates are the producers with an open telemetry stream that published
    to the message's topic (and, when the half message names a producer
    group, those of that group first; the official clients name none, so
    the topic stands for the group as in RocketMQ's proxy). A stream is
    *dead* when its client has not been heard from (heartbeat, send,
    telemetry frame) for ``alive_within`` seconds: the official clients
    heartbeat every 10 s, so a silent one is gone even if its TCP connection
    has not been torn down yet. Candidates are taken round robin, so checks
    spread over a producer group's processes. ``send_checks`` answers False
    for a check nobody live could take: the check service then tries it
    again next round without counting it.

    Called from the broker's tick thread with a batch of checks; hops onto
    the event loop once per batch and waits at most ``timeout`` for the
    answer to "which did a live stream take?" (one hop per message cost
    ~0.8 ms each on a busy loop: a third of a 100,000-orphan scan).

    Checks are paced to the producers (:mod:`halfmoon.server.check_pacing`):
    a stream with ``max_outstanding`` unanswered checks takes no more, round
    robin picks among the streams with room, and a transaction whose check
    is still outstanding at a live stream is not sent again; both answer
    "not taken". :meth:`answered` (wired to every EndTransaction by the check
    service) clears a check; :meth:`pace_checks` sets the limits.
    """

    def __init__(
        self,
        registry: ClientRegistry,
        timeout: float = 1.0,
        alive_within: float = 30.0,
        max_outstanding: int = 2_000,
        lost_after_ms: int = 6_000,
    ) -> None:
        self._registry = registry
        self._timeout = timeout
        self._alive_within = alive_within
        self._round_robin = itertools.count()
        self.outstanding = OutstandingChecks(max_outstanding, lost_after_ms)

    def pace_checks(
        self, *, max_outstanding: int, lost_after_ms: int, clock: Callable[[], int] | None = None
    ) -> None:
        """Unanswered checks one stream may hold, and when one counts as lost (the check service's
        clock)."""
        self.outstanding.configure(
            max_per_stream=max_outstanding, lost_after_ms=lost_after_ms, clock=clock
        )

    def answered(self, transaction_id: str) -> None:
        """An EndTransaction arrived for ``transaction_id`` (any thread): its check is answered."""
        self.outstanding.answered(transaction_id)

    def awaiting_answer(self, transaction_id: str) -> bool:
        """True when a live stream holds an unanswered, not yet lost check of it (any thread).

        The scan then skips the transaction without reading its half record;
        ``send_checks`` would refuse it anyway.
        """
        found = self.outstanding.awaiting(transaction_id)
        if found is None:
            return False
        stream, client_id = found
        session = self._registry.get(
            client_id
        )  # read from another thread: a stale answer costs one round
        return (
            session is not None
            and session.outbox is stream
            and time.monotonic() - session.last_seen <= self._alive_within
        )

    def room(self, producer_group: str | None, topic: str) -> int:
        """How many checks of (``producer_group``, ``topic``) the live streams take now, as
        :meth:`send_checks` would pick them (any thread: the check scan asks before it reads
        any half record, so a full producer costs it no reads; a stale answer costs a round).
        """
        self.outstanding.expire()
        candidates = self.live_producers(topic, producer_group) if producer_group else []
        if not candidates:
            candidates = self.live_producers(topic)
        return sum(max(0, self.outstanding.room(s.outbox)) for s in candidates)

    def live_producers(self, topic: str, group: str | None = None) -> list[ClientSession]:
        """Producers of ``topic`` (of ``group`` when given) with a live stream (any thread)."""
        now = time.monotonic()
        return [
            s
            for s in self._registry.producers(topic=topic, group=group)
            if now - s.last_seen <= self._alive_within
        ]

    def _prune_on_loop(self) -> None:
        """Release the checks of streams that ended or went silent; clear the lost ones."""
        now = time.monotonic()
        for stream, client_id in self.outstanding.streams().items():
            session = self._registry.get(client_id)
            if (
                session is None
                or session.outbox is not stream
                or now - session.last_seen > self._alive_within
            ):
                released = self.outstanding.release(stream)
                log.info("event=checks_released client_id=%s checks=%d", client_id, released)
        self.outstanding.expire()

    def _send_on_loop(
        self,
        command: service_pb2.TelemetryCommand,
        topic: str,
        group: str | None,
        transaction_id: str,
        live: dict[tuple[str, str | None], list[ClientSession]],
    ) -> str | None:
        outstanding = self.outstanding
        if outstanding.holder(transaction_id) is not None:
            return (
                None  # still outstanding at a live stream (pruned just before): wait for its answer
            )
        candidates = live.get((topic, group))
        if candidates is None:  # once per (topic, group) and batch, not per check
            candidates = self.live_producers(topic, group) if group else []
            if not candidates:
                candidates = self.live_producers(topic)
            live[(topic, group)] = candidates
        with_room = [s for s in candidates if outstanding.has_room(s.outbox)]
        if not with_room:
            return None
        session = with_room[next(self._round_robin) % len(with_room)]
        stream = session.outbox
        if not self._registry.send_command(session.client_id, command):
            return None
        outstanding.sent(transaction_id, stream, session.client_id)
        return session.client_id

    def _send_batch_on_loop(
        self, commands: list[tuple[service_pb2.TelemetryCommand, str, str | None, str]]
    ) -> list[bool]:
        self._prune_on_loop()
        live: dict[tuple[str, str | None], list[ClientSession]] = {}
        return [self._send_on_loop(*c, live) is not None for c in commands]

    def send_checks(self, checks: Sequence[Any]) -> list[bool]:
        """Hand a batch of checks (``CheckRequest``s) to live producer streams in one loop hop.

        The wire messages are built here, on the caller's thread; the event
        loop only picks a stream for each and queues the command. Per check,
        True only if a live stream with room took it (see the class docs). When the loop does not
        answer
        within ``timeout`` the whole batch counts as not sent (retried next
        round; a command queued after all reaches the producer as one extra,
        uncounted check, which it answers like any other).
        """
        if not checks:
            return []
        commands = [
            (
                check_command(c.message, c.transaction_id),
                c.topic,
                c.producer_group,
                c.transaction_id,
            )
            for c in checks
        ]
        future = self._registry._run_threadsafe(lambda: self._send_batch_on_loop(commands))
        try:
            taken = future.result(timeout=self._timeout)
        except TimeoutError:
            # The loop is too busy to answer: treat the batch as not sent (retried next round).
            log.warning("event=check_send_timeout checks=%d", len(checks))
            return [False] * len(checks)
        if taken is None:  # no loop (not serving, or shutting down)
            return [False] * len(checks)
        log.debug("event=checks_sent checks=%d taken=%d", len(checks), sum(taken))
        return taken

    def send_check(
        self, producer_group: str | None, topic: str, message: object, transaction_id: str
    ) -> bool:
        """One check (:meth:`send_checks` with a batch of one); kept for callers of the older
        API."""
        request = _Check(producer_group, topic, message, transaction_id)
        return self.send_checks([request])[0]


@dataclass(frozen=True, slots=True)
class _Check:
    """Shaped like ``halfmoon.broker.transactions.CheckRequest`` (no import of the broker's
    internals)."""

    producer_group: str | None
    topic: str
    message: Any
    transaction_id: str
