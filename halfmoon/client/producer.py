"""The producer: send, send_async, send_oneway and batches, with retries and fault tolerance.

A send resolves the topic's route (cached), picks a broker (round robin over
the writable queues' brokers, skipping brokers the latency fault tolerance is
avoiding), and calls ``SendMessage``. A retryable failure (server down or
restarting, throttled, internal error, timeout) is retried up to
``max_attempts`` times in total, with exponential backoff, preferring another
broker; the message keeps its id across attempts. Errors that retrying cannot
fix (unknown topic, wrong message type, oversize body) are raised at once.

``max_attempts`` and the backoff default to what the server announces in its
settings answer (RocketMQ's proxy: 3 attempts); pass them to override.

Coalescing (on by default, ``coalesce=False`` turns it off): ``send``,
``send_async`` and ``send_oneway`` go through a :class:`SendCoalescer`, which
packs sends that arrive while a request for the same topic is in flight into
the next request (each caller still gets its own receipt or error; a lone send
goes out at once). See :mod:`halfmoon.client.coalesce` for the rules.
``send_batch`` and transactional sends use their own requests, as before.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from halfmoon.client.batch import DEFAULT_MAX_BATCH_BYTES, split_batch
from halfmoon.client.client import BaseClient, as_config
from halfmoon.client.coalesce import DEFAULT_MAX_ENTRIES, CoalescingStats, Outcome, SendCoalescer
from halfmoon.client.connection import Backoff, ClientConfig
from halfmoon.client.errors import (
    ClientError,
    MessageBodyTooLarge,
    MessageTypeMismatch,
    ProducerError,
    error_for_status,
)
from halfmoon.client.fault import LatencyFaultPolicy, LatencyFaultTolerance
from halfmoon.client.message import Message, SendReceipt, message_ids, to_wire
from halfmoon.client.route import QueueInfo, TopicRoute

log = logging.getLogger("halfmoon.client.producer")

SendCallback = Callable[[SendReceipt | None, BaseException | None], Any]


@dataclass
class ProducerStats:
    """Counters for tests and dashboards."""

    requests: int = 0
    messages: int = 0
    retries: int = 0
    failures: int = 0


class Producer(BaseClient):
    """Sends messages.

    ``async with Producer("127.0.0.1:8081") as producer: await producer.send(msg)``.

    ``topics`` are announced up front (their routes are fetched at start, so a
    missing topic fails early); others are resolved on first send.
    """

    client_type = pb.ClientType.PRODUCER

    def __init__(
        self,
        config: ClientConfig | str,
        *,
        topics: Iterable[str] = (),
        max_attempts: int | None = None,
        retry_backoff: Backoff | None = None,
        fault_policy: LatencyFaultPolicy | None = None,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        coalesce: bool = True,
        max_coalesced_messages: int = DEFAULT_MAX_ENTRIES,
        **options: Any,
    ) -> None:
        super().__init__(as_config(config, **options))
        self.topics = list(dict.fromkeys(topics))
        self._max_attempts_override = max_attempts
        self._backoff_override = retry_backoff
        self.max_attempts = max_attempts or 3
        self.retry_backoff = retry_backoff or Backoff(initial=0.01, maximum=1.0)
        self.max_body_size = 4 * 1024 * 1024
        self.max_batch_bytes = max_batch_bytes
        self.faults = LatencyFaultTolerance(fault_policy)
        self.stats = ProducerStats()
        self._round_robin = itertools.count()
        self._inflight: set[asyncio.Task[Any]] = set()
        self._coalescer = (
            SendCoalescer(
                self._send_coalesced, max_entries=max_coalesced_messages, max_bytes=max_batch_bytes
            )
            if coalesce
            else None
        )

    @property
    def coalescing(self) -> CoalescingStats | None:
        """How sends shared requests (``None`` when ``coalesce=False``)."""
        return self._coalescer.stats if self._coalescer is not None else None

    # -- settings ---------------------------------------------------------------------

    def _settings(self) -> pb.Settings:
        settings = super()._settings()
        settings.publishing.topics.extend(
            pb.Resource(name=t, resource_namespace=self.config.namespace) for t in self.topics
        )
        settings.publishing.validate_message_type = True
        return settings

    def _apply_settings(self, settings: pb.Settings) -> None:
        super()._apply_settings(settings)
        policy = settings.backoff_policy
        if self._max_attempts_override is None and policy.max_attempts > 0:
            self.max_attempts = policy.max_attempts
        if self._backoff_override is None and policy.HasField("exponential_backoff"):
            exp = policy.exponential_backoff
            self.retry_backoff = Backoff(
                initial=max(exp.initial.ToMilliseconds() / 1000, 0.001),
                maximum=max(exp.max.ToMilliseconds() / 1000, 0.001),
                multiplier=exp.multiplier or 2.0,
            )
        if settings.publishing.max_body_size > 0:
            self.max_body_size = settings.publishing.max_body_size

    async def _on_started(self) -> None:
        for topic in self.topics:
            await self.routes.get(topic)

    async def _on_closing(self) -> None:
        # Let queued, in-flight async and oneway sends finish (bounded), then drop the rest.
        if self._coalescer is not None:
            try:
                await asyncio.wait_for(self._coalescer.flush(), self.config.request_timeout)
            except TimeoutError:
                self._coalescer.cancel()
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=self.config.request_timeout)
            for task in list(self._inflight):
                task.cancel()

    # -- public API -----------------------------------------------------------------------

    async def send(self, message: Message, *, timeout: float | None = None) -> SendReceipt:
        """Send one message and wait for the server's receipt (retrying as configured)."""
        self._check_open()
        wire = self._wire(message)
        if self._coalescer is not None:
            # Queued synchronously, so concurrent sends reach the wire in call order.
            return await self._coalescer.submit(message.topic, wire, timeout=timeout)
        receipts = await self._send(message.topic, [wire], timeout=timeout)
        return receipts[0]

    def send_async(
        self,
        message: Message,
        callback: SendCallback | None = None,
        *,
        timeout: float | None = None,
    ) -> asyncio.Task[SendReceipt]:
        """Start sending; returns a task to await. ``callback(receipt, error)`` runs when done."""
        self._check_open()
        # Queue (or start) the send now, not when the task first runs: a close() right
        # after send_async() must still send it.
        wire = self._wire(message)
        if self._coalescer is not None:
            task = asyncio.ensure_future(
                _receipt_of(self._coalescer.submit(message.topic, wire, timeout=timeout))
            )
        else:
            task = asyncio.ensure_future(_first(self._send(message.topic, [wire], timeout=timeout)))
        self._track(task)
        if callback is not None:
            task.add_done_callback(lambda t: _run_callback(callback, t))
        return task

    def send_oneway(self, message: Message) -> None:
        """Send without waiting for (or retrying on) the answer; failures are only logged."""
        self._check_open()
        wire = self._wire(message)
        if self._coalescer is not None:
            self._coalescer.submit(message.topic, wire, retry=False).add_done_callback(
                _log_oneway_failure
            )
            return
        task = asyncio.ensure_future(self._send(message.topic, [wire], retry=False))
        self._track(task)
        task.add_done_callback(_log_oneway_failure)

    async def send_batch(
        self, messages: Sequence[Message], *, timeout: float | None = None
    ) -> list[SendReceipt]:
        """Send many messages of one topic; split into requests under ``max_batch_bytes`` (4 MiB).

        Receipts come back in the order of ``messages``. Each request is retried
        on its own; if one fails for good, :class:`ProducerError` says how many were sent.
        """
        self._check_open()
        if not messages:
            return []
        topic = messages[0].topic
        if any(m.topic != topic for m in messages):
            raise ValueError("a batch must target one topic; send one batch per topic")
        if any(m.delivery_timestamp is not None for m in messages):
            raise ValueError("delay messages cannot be batched; send them one by one")
        wires = [self._wire(m) for m in messages]
        receipts: list[SendReceipt] = []
        for chunk in split_batch(wires, self.max_batch_bytes):
            try:
                receipts.extend(await self._send(topic, chunk, timeout=timeout))
            except ClientError as exc:
                if not receipts:
                    raise
                raise ProducerError(
                    f"batch send failed after {len(receipts)} of {len(messages)} messages were "
                    f"sent: {exc.message}"
                ) from exc
        return receipts

    # -- internals ----------------------------------------------------------------------

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    def _wire(self, message: Message, *, transactional: bool = False) -> pb.Message:
        if len(message.body) > self.max_body_size:
            raise MessageBodyTooLarge(
                f"message body is {len(message.body)} bytes, above the server's "
                f"{self.max_body_size}-byte limit; "
                "send smaller bodies or raise the server's max_body_size"
            )
        return to_wire(
            message, message_ids.next(), self.config.namespace, transactional=transactional
        )

    async def _route(self, topic: str) -> TopicRoute:
        route = self.routes.cached(topic)
        if route is None:
            route = await self.routes.get(topic)
        return route

    def _candidates(self, route: TopicRoute) -> list[QueueInfo]:
        queues = route.writable()
        if not queues:
            raise error_for_status(
                pb.Status(
                    code=pb.Code.FORBIDDEN, message=f"topic {route.topic!r} has no writable queue"
                ),
                "SendMessage",
            )
        return queues

    def _pick(self, queues: list[QueueInfo], tried: set[str]) -> QueueInfo:
        start = next(self._round_robin)
        ordered = [queues[(start + i) % len(queues)] for i in range(len(queues))]
        fresh = [q for q in ordered if q.broker_name not in tried] or ordered
        broker = self.faults.pick([q.broker_name for q in fresh])
        for queue in fresh:
            if queue.broker_name == broker:
                return queue
        return fresh[0]

    def _check_type(self, route: TopicRoute, wires: Sequence[pb.Message]) -> None:
        accepted = route.queues[0].accept_types if route.queues else frozenset()
        if not accepted:
            return
        for wire in wires:
            if wire.system_properties.message_type not in accepted:
                names = ", ".join(sorted(pb.MessageType.Name(t) for t in accepted))
                kind = pb.MessageType.Name(wire.system_properties.message_type)
                raise MessageTypeMismatch(
                    f"topic {route.topic!r} accepts {names} messages, not {kind}; send to a topic "
                    "of that type"
                )

    async def _send(
        self,
        topic: str,
        wires: Sequence[pb.Message],
        *,
        timeout: float | None = None,
        retry: bool = True,
    ) -> list[SendReceipt]:
        # Without ``partial`` every outcome is a receipt: a failed entry raises.
        return cast(
            list[SendReceipt], await self._send_request(topic, wires, timeout=timeout, retry=retry)
        )

    async def _send_coalesced(
        self, topic: str, wires: Sequence[pb.Message], timeout: float | None, retry: bool
    ) -> list[Outcome]:
        return await self._send_request(topic, wires, timeout=timeout, retry=retry, partial=True)

    async def _send_request(
        self,
        topic: str,
        wires: Sequence[pb.Message],
        *,
        timeout: float | None = None,
        retry: bool = True,
        partial: bool = False,
    ) -> list[Outcome]:
        """One request with retries; with ``partial``, a per-entry failure is returned in its
        place, not raised."""
        route = await self._route(topic)
        self._check_type(route, wires)
        queues = self._candidates(route)
        request = svc.SendMessageRequest(messages=wires)
        attempts = self.max_attempts if retry else 1
        loop = asyncio.get_running_loop()
        tried: set[str] = set()
        attempt = 0
        while True:
            attempt += 1
            queue = queues[0] if len(queues) == 1 else self._pick(queues, tried)
            connection = self._pool.get(queue.endpoint)
            started = loop.time()
            self.stats.requests += 1
            try:
                response = await connection.call("SendMessage", request, timeout=timeout)
                receipts = _receipts(response, len(wires), queue.endpoint, partial=partial)
            except ClientError as exc:
                self.faults.record(queue.broker_name, loop.time() - started, failed=True)
                tried.add(queue.broker_name)
                if not exc.retryable or attempt >= attempts or self._closed:
                    self.stats.failures += 1
                    if attempt > 1 and exc.retryable:
                        raise ProducerError(
                            f"send to {topic!r} failed after {attempt} attempts: {exc.message}",
                            code=exc.code,
                        ) from exc
                    raise
                self.stats.retries += 1
                log.info("event=send_retry topic=%s attempt=%d error=%s", topic, attempt, exc.code)
                await asyncio.sleep(self.retry_backoff.delay(attempt))
                if exc.code == "TOPIC_NOT_FOUND":
                    route = await self.routes.refresh(topic)
                    queues = self._candidates(route)
                continue
            self.faults.record(queue.broker_name, loop.time() - started)
            self.stats.messages += sum(1 for r in receipts if isinstance(r, SendReceipt))
            return receipts


def _receipts(
    response: svc.SendMessageResponse, expected: int, endpoint: str, *, partial: bool = False
) -> list[Outcome]:
    status = response.status
    if status.code not in (pb.Code.OK, pb.Code.MULTIPLE_RESULTS):
        raise error_for_status(status, "SendMessage")
    receipts: list[Outcome] = []
    for entry in response.entries:
        if entry.status.code not in (pb.Code.OK, pb.Code.CODE_UNSPECIFIED):
            if partial:  # this entry failed alone (MULTIPLE_RESULTS); its caller gets the error
                receipts.append(error_for_status(entry.status, "SendMessage"))
                continue
            raise error_for_status(entry.status, "SendMessage")
        receipts.append(
            SendReceipt(
                entry.message_id, entry.offset, entry.transaction_id, entry.recall_handle, endpoint
            )
        )
    if len(receipts) != expected:
        raise error_for_status(
            pb.Status(
                code=pb.Code.INTERNAL_SERVER_ERROR,
                message=f"server answered {len(receipts)} receipts for {expected} messages",
            ),
            "SendMessage",
        )
    return receipts


async def _receipt_of(future: asyncio.Future[SendReceipt]) -> SendReceipt:
    return await future


async def _first(receipts: Awaitable[list[SendReceipt]]) -> SendReceipt:
    return (await receipts)[0]


def _run_callback(callback: SendCallback, task: asyncio.Task[SendReceipt]) -> None:
    try:
        if task.cancelled():
            callback(None, asyncio.CancelledError())
        elif task.exception() is not None:
            callback(None, task.exception())
        else:
            callback(task.result(), None)
    except Exception:  # noqa: BLE001 - a user's callback must not break the loop
        log.exception("event=send_callback_failed")


def _log_oneway_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("event=oneway_send_failed error=%r", task.exception())
