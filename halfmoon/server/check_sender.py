"""Transaction checks over the telemetry stream: the broker's CheckSender asks a live producer
of a half message's group to resolve it (RocketMQ's ``RecoverOrphanedTransactionCommand``)."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rocketmq.grpc_protocol import definition_pb2, service_pb2

from halfmoon.broker.message import MessageView
from halfmoon.server.check_pacing import (
    DEFAULT_LOST_AFTER_MS,
    DEFAULT_MAX_PER_STREAM,
    OutstandingChecks,
)
from halfmoon.server.convert import fill_wire_message
from halfmoon.server.telemetry import ClientRegistry, ClientSession

log = logging.getLogger("halfmoon.server.telemetry")


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
        max_outstanding: int = DEFAULT_MAX_PER_STREAM,
        lost_after_ms: int = DEFAULT_LOST_AFTER_MS,
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
