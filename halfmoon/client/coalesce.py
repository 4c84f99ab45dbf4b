"""Coalesce concurrent sends to one topic into one ``SendMessage`` request.

The server's cost is mostly per request (one gRPC call, one trip to its
worker pool, one wait for the store), not per message, so many senders each
awaiting their own ``send()`` go faster when their messages share requests.
This is Kafka's batching without ``linger.ms``: nothing ever waits for a
timer.

The algorithm, per topic (a *lane*):

- ``submit`` appends the message and a future to the lane's queue. If the lane
  has no request in flight, a drain task starts at once: an idle producer
  sends a lone message immediately, in a request of its own.
- While a request is in flight, later sends wait in the queue. When the answer
  comes back, the drain task takes everything queued (in order, up to
  ``max_entries`` messages and ``max_bytes`` on the wire) into the next
  request. Batch size follows load: 1 when idle, about the number of
  concurrent senders when busy.
- One request in flight per topic keeps requests in submission order; inside
  a request, entries are in submission order and the server stores them in
  that order. So a message group's order (FIFO) is the order of the
  ``send()`` calls, as without coalescing.

Answers. The server answers one entry per message, in order; each caller's
future gets its own receipt. halfmoon's server checks a whole request before
storing any of it, so a request refused because of one message (a
:class:`BadRequest`: oversize body, bad tag or key, wrong message type...)
stored nothing: the lane then sends each of its messages in a request of its
own, and only the bad message's caller sees the error. Errors about the topic
(not found, forbidden) or that survived the retries fail every caller of the
request. A server that answers per entry (``MULTIPLE_RESULTS``) has each
failed entry resent on its own, so a retryable failure still gets retries.

Retries, backoff and latency fault tolerance are the producer's, applied per
request (``send_request``). A request retries if any of its messages wants
retries (``send_oneway`` messages ride along; a retry cannot hurt them).
A request's per-attempt timeout is the smallest one its callers asked for.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from rocketmq.grpc_protocol import definition_pb2 as pb

from halfmoon.client.batch import framed_size
from halfmoon.client.errors import BadRequest, ClientError
from halfmoon.client.message import SendReceipt

log = logging.getLogger("halfmoon.client.coalesce")

DEFAULT_MAX_ENTRIES = 256

Outcome = SendReceipt | ClientError
# send_request(topic, wires, timeout, retry) -> one outcome per wire, in order; raises
# a ClientError when the whole request failed (after the producer's retries).
SendRequest = Callable[[str, Sequence[pb.Message], float | None, bool], Awaitable[list[Outcome]]]


@dataclass(eq=False)
class _Pending:
    wire: pb.Message
    size: int
    future: asyncio.Future[SendReceipt]
    retry: bool
    timeout: float | None


@dataclass(eq=False)
class _Lane:
    queue: deque[_Pending] = field(default_factory=deque)
    drainer: asyncio.Task[None] | None = None


@dataclass
class CoalescingStats:
    """How well sends share requests (``requests`` counts first attempts only)."""

    requests: int = 0
    messages: int = 0
    largest: int = 0
    isolated: int = 0  # messages resent alone after their shared request was refused


class SendCoalescer:
    """Per-topic lanes that pack concurrent sends into shared requests (see the module docs)."""

    def __init__(
        self, send_request: SendRequest, *, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._send_request = send_request
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.stats = CoalescingStats()
        self._lanes: dict[str, _Lane] = {}

    def submit(
        self, topic: str, wire: pb.Message, *, retry: bool = True, timeout: float | None = None
    ) -> asyncio.Future[SendReceipt]:
        """Queue one message; the future resolves to its receipt or its own error.

        Synchronous on purpose: the order of ``submit`` calls is the order on the wire.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[SendReceipt] = loop.create_future()
        lane = self._lanes.get(topic)
        if lane is None:
            lane = self._lanes[topic] = _Lane()
        lane.queue.append(_Pending(wire, framed_size(wire), future, retry, timeout))
        if lane.drainer is None:
            # No request in flight for this topic: go now (the task runs on the next
            # loop step, so sends submitted in the same step share its request).
            lane.drainer = loop.create_task(self._drain(topic, lane))
        return future

    async def flush(self) -> None:
        """Wait until every message submitted so far has its answer."""
        while True:
            drainers = [lane.drainer for lane in self._lanes.values() if lane.drainer is not None]
            if not drainers:
                return
            await asyncio.wait(drainers)

    def cancel(self) -> None:
        """Stop every lane; callers still waiting get ``CancelledError``."""
        for lane in self._lanes.values():
            if lane.drainer is not None:
                lane.drainer.cancel()
            while lane.queue:
                lane.queue.popleft().future.cancel()

    # -- internals -------------------------------------------------------------------

    async def _drain(self, topic: str, lane: _Lane) -> None:
        try:
            while True:
                batch = self._take(lane)
                if not batch:
                    return
                await self._send_batch(topic, batch)
        finally:
            # No await between the empty queue and here, so nothing was submitted
            # meanwhile: the next submit finds no drainer and starts one.
            lane.drainer = None
            if not lane.queue and self._lanes.get(topic) is lane:
                del self._lanes[topic]  # idle topics cost nothing

    def _take(self, lane: _Lane) -> list[_Pending]:
        """The next request's messages: a consecutive run of the queue within both limits."""
        batch: list[_Pending] = []
        size = 0
        while lane.queue and len(batch) < self.max_entries:
            head = lane.queue[0]
            if head.future.done():  # the caller gave up (cancelled) before it was sent
                lane.queue.popleft()
                continue
            if batch and size + head.size > self.max_bytes:
                break
            batch.append(lane.queue.popleft())
            size += head.size
        return batch

    async def _send_batch(self, topic: str, batch: list[_Pending]) -> None:
        self.stats.requests += 1
        self.stats.messages += len(batch)
        self.stats.largest = max(self.stats.largest, len(batch))
        try:
            outcomes = await self._request(topic, batch)
        except BadRequest as exc:
            if len(batch) == 1:
                _settle(batch[0], exc)
                return
            # Refused for (probably) one message; nothing of it was stored. Send each
            # message alone so only the bad one's caller sees an error.
            self.stats.isolated += len(batch)
            for pending in batch:
                await self._send_alone(topic, pending)
            return
        except ClientError as exc:
            for pending in batch:
                _settle(pending, exc)
            return
        except asyncio.CancelledError:
            for pending in batch:
                pending.future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - a bug must reach the callers, not hang them
            log.exception("event=coalesced_send_failed topic=%s", topic)
            for pending in batch:
                _settle(pending, exc)
            return
        for pending, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, ClientError) and len(batch) > 1:
                # A per-entry failure from a server that answers per entry: the entry was
                # not stored; give it its own request (and its own retries).
                self.stats.isolated += 1
                await self._send_alone(topic, pending)
            else:
                _settle(pending, outcome)

    async def _send_alone(self, topic: str, pending: _Pending) -> None:
        if pending.future.done():
            return
        try:
            outcome = (await self._request(topic, [pending]))[0]
        except ClientError as exc:
            outcome = exc
        _settle(pending, outcome)

    async def _request(self, topic: str, batch: list[_Pending]) -> list[Outcome]:
        timeouts = [p.timeout for p in batch if p.timeout is not None]
        retry = any(p.retry for p in batch)
        return await self._send_request(
            topic, [p.wire for p in batch], min(timeouts) if timeouts else None, retry
        )


def _settle(pending: _Pending, outcome: SendReceipt | BaseException) -> None:
    if pending.future.done():
        return
    if isinstance(outcome, BaseException):
        pending.future.set_exception(outcome)
    else:
        pending.future.set_result(outcome)
