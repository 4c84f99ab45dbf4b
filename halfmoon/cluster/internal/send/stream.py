"""A proxy's sends to one broker: coalesced on an event loop, carried by one long-lived
connection to the broker's send listener.

The front end's ``SendMessage`` handlers run on the proxy's event loop; each
awaits :meth:`StreamSender.send`. Sends waiting while a request is in flight
go out together in the next request (group commit), and a request is one
frame on a :class:`~halfmoon.cluster.internal.send.links.TcpLink` to the
broker's send listener (``[request_id, timeout_ms, batches]``, answered in
order with ``[request_id, answers]``; TLS with ``[internal]``). This is the
one route a proxy's sends take: measured (docs/benchmarks.md, "The broker's
send listener"), a unary gRPC call per request cost the broker about 550 µs
of gRPC machinery and the proxy a worker-thread hop, a request on a gRPC
stream about 180 µs, a frame on the listener about 55.

A send alone goes out in the next turn of the loop (so the sends decoded in
one turn share a request). Under load the next request gathers (Kafka's
``linger.ms``, bounded and only under load): when an answer releases several
callers, or finds others waiting, the senders just answered are expected
back (each producer has one send outstanding and sends its next on the
answer), so the next request goes out once as many callers wait as the
answered request carried plus those already waiting, or after the linger,
whichever comes first. The linger is :data:`LINGER_S` from
:data:`LINGER_FULL_AT` expected callers, proportionally less below that
(two producers taking turns wait at most half a millisecond for each other),
and nothing at all for a lone sender. At most ``max_in_flight`` requests are
unanswered at a time, and a request carries at most ``max_messages``
messages or ``max_bytes`` of bodies; each caller's batch stays one unit on
the broker (stored all or nothing, as ``send`` promises).

Failures:

- a request unanswered after ``timeout_s`` fails its callers with
  ``BROKER_DEADLINE_EXCEEDED`` (the outcome is unknown). If nothing at all was
  answered since it left, the broker is silent (a partition that drops
  packets leaves the connection open but dead): the connection is reset, the other
  requests in flight fail with ``BROKER_UNAVAILABLE``, the broker is reported
  (suspect: sends steer elsewhere for a moment) and the next send opens a new
  connection. If the broker answered other requests meanwhile it is alive, only
  slow (overloaded): that request alone fails, and the connection, the requests
  behind it and the broker's standing are left alone, so an overload does not
  turn into a second of refused sends;
- a connection that breaks (broker gone, connection refused) fails every request
  in flight with ``BROKER_UNAVAILABLE`` at once, without waiting for the
  broker to come back (a dead broker is reported, not waited for); the next
  send opens a new connection;
- a version mismatch fails them with ``WIRE_VERSION_MISMATCH``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence

from halfmoon.broker.encoded import SentMessage
from halfmoon.broker.produce import SendResult
from halfmoon.cluster.internal import fencing, wire
from halfmoon.cluster.internal.internal_tls import PLAINTEXT, InternalTls
from halfmoon.cluster.internal.send.frames import too_large
from halfmoon.cluster.internal.send.links import Link, TcpLink
from halfmoon.errors import HalfmoonError

log = logging.getLogger("halfmoon.cluster")

DEFAULT_STREAM_IN_FLIGHT = 1  # measured: one request in flight coalesces the most
DEFAULT_MAX_MESSAGES = 1024
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
# Gathering after an answer (module docstring): the next request waits for the callers just
# answered plus those already waiting, at most LINGER_S * min(1, expected / LINGER_FULL_AT).
# Measured through one proxy (bench/proxy_bench.py, two alternated runs each, load 5-12 on the
# 2 cores): with the previous rule (linger only when sends wait at an answer, scaled by the last
# request's size) requests carried 1.5-4.2 messages at 16-64 producers; gathering, 2.8-13.6,
# with 2 producers at 1.0-1.5 and their p50 unchanged. A lone sender never waits.
LINGER_S = 0.005
LINGER_FULL_AT = 8

# Called after each request with (messages, callers' batches): the proxy's metrics.
RequestObserver = Callable[[int, int], None]
_Waiting = tuple[list[SentMessage], "asyncio.Future[list[SendResult]]"]


class StreamSender:
    """Sends to the broker at ``target`` (its internal address) through its send listener on
    ``send_port`` (the same host); create and use it on one event loop."""

    def __init__(
        self,
        target: str,
        metadata: tuple[tuple[str, str], ...],
        *,
        send_port: int,
        timeout_s: float,
        max_in_flight: int = DEFAULT_STREAM_IN_FLIGHT,
        max_messages: int = DEFAULT_MAX_MESSAGES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        observer: RequestObserver | None = None,
        on_failure: Callable[[HalfmoonError], None] | None = None,
        on_answer: Callable[[], None] | None = None,
        linger_s: float = LINGER_S,
        tls: InternalTls = PLAINTEXT,
    ) -> None:
        self.target = target
        self._tls = tls
        self._metadata = metadata
        self._timeout_s = timeout_s
        self._max_in_flight = max_in_flight
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._observer = observer
        self._on_failure = on_failure  # the link broke with requests in flight
        self._on_answer = on_answer  # a request was answered
        self._loop = asyncio.get_running_loop()
        self.send_port = send_port
        self._link: Link | None = None
        self._waiting: list[_Waiting] = []
        self._in_flight: dict[int, tuple[list[_Waiting], asyncio.TimerHandle]] = {}
        self._ids = itertools.count(1)
        self._last_answer_at = float("-inf")  # loop time of the latest answer
        self._flush_scheduled = False
        self._closed = False
        self._linger_s = linger_s
        # Gathering after an answer: the next request waits (until ``_gather_until``, a loop
        # time) for ``_gather_target`` callers, the ones just answered coming back.
        self._gather_target = 0
        self._gather_until = 0.0
        self._gather_timer: asyncio.TimerHandle | None = None
        self.requests = 0  # requests sent
        self.sends = 0  # callers' batches they carried
        self.messages = 0  # messages they carried

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    async def send(self, messages: Sequence[SentMessage]) -> list[SendResult]:
        """Store ``messages`` (one caller's batch, all or nothing); their results once durable."""
        if self._closed:
            raise wire.BrokerUnavailable(f"the connection to the broker at {self.target} is closed")
        future: asyncio.Future[list[SendResult]] = self._loop.create_future()
        self._waiting.append((list(messages), future))
        if len(self._in_flight) < self._max_in_flight:
            if self._gather_timer is not None:
                if len(self._waiting) >= self._gather_target:
                    self._flush()  # everyone expected is here: no need to wait out the linger
            elif not self._flush_scheduled:
                self._flush_scheduled = True
                if len(self._waiting) < self._gather_target and (
                    self._loop.time() < self._gather_until
                ):
                    self._gather_timer = self._loop.call_at(self._gather_until, self._flush)
                else:
                    self._loop.call_soon(self._flush)
        return await future

    async def close(self) -> None:
        self._closed = True
        self._fail_all(wire.BrokerUnavailable(f"the connection to {self.target} was closed"))
        link, self._link = self._link, None
        if link is not None:
            link.cancel()

    # -- requests ----------------------------------------------------------------------------

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._gather_timer is not None:
            self._gather_timer.cancel()
            self._gather_timer = None
        self._gather_target = 0
        while self._waiting and len(self._in_flight) < self._max_in_flight:
            self._write(self._take())

    def _take(self) -> list[_Waiting]:
        taken: list[_Waiting] = []
        count = size = 0
        for entry in self._waiting:
            entry_size = sum(len(m.body) for m in entry[0])
            if taken and (
                count + len(entry[0]) > self._max_messages or size + entry_size > self._max_bytes
            ):
                break
            taken.append(entry)
            count += len(entry[0])
            size += entry_size
        del self._waiting[: len(taken)]
        return taken

    def _write(self, taken: list[_Waiting]) -> None:
        request_id = next(self._ids)
        batches = [messages for messages, _ in taken]
        try:
            request = wire.encode([request_id, int(self._timeout_s * 1000), batches])
            error = too_large(len(request))
            if error is not None:
                raise error
            link = self._current_link()
        except Exception as exc:  # noqa: BLE001 - these callers hear of it, the next ones retry
            _fail(taken, exc if isinstance(exc, HalfmoonError) else HalfmoonError(str(exc)))
            return
        timer = self._loop.call_later(self._timeout_s, self._expire, request_id)
        self._in_flight[request_id] = (taken, timer)
        self.requests += 1
        self.sends += len(taken)
        count = sum(len(b) for b in batches)
        self.messages += count
        if self._observer is not None:
            self._observer(count, len(taken))
        link.write(request)

    def _current_link(self) -> Link:
        if self._link is None:
            headers = dict(self._metadata)
            hello: dict[str, object] = {
                "version": headers.get(wire.VERSION_HEADER, ""),
                "peer": headers.get("hm-peer", ""),
            }
            epoch = headers.get(fencing.EPOCH_HEADER)
            if epoch is not None:  # the group epoch (connection metadata): fencing.py
                hello["epoch"] = int(epoch)
            host = self.target.rpartition(":")[0].strip("[]")
            self._link = TcpLink(
                host, self.send_port, hello, self._answered, self._ended, self._tls
            )
        return self._link

    def _ended(self, link: Link, error: HalfmoonError | None) -> None:
        """``link`` ended by itself: fail what is in flight on it; the next send opens another."""
        if self._link is not link:
            return  # reset meanwhile: its requests were failed, the next link's are not ours
        self._link = None
        failure = error or wire.BrokerUnavailable(
            f"the broker at {self.target} closed the send connection; the outcome is unknown"
        )
        if self._in_flight and self._on_failure is not None:
            self._on_failure(failure)
        self._fail_all(failure, keep_waiting=True)
        if self._waiting and not self._closed:
            self._flush()

    def _answered(self, raw: bytes) -> None:
        request_id, answers = wire.decode(raw)
        if request_id is None and isinstance(answers, HalfmoonError):
            # The broker refused a request it could not read; it closes the link next.
            log.warning("event=send_refused broker=%s error=%s", self.target, answers)
            return
        self._last_answer_at = self._loop.time()
        entry = self._in_flight.pop(request_id, None)
        if entry is None:
            return  # expired meanwhile: its callers were told
        taken, timer = entry
        timer.cancel()
        if self._on_answer is not None:
            self._on_answer()
        if isinstance(answers, HalfmoonError):
            _fail(taken, answers)
        elif not isinstance(answers, list) or len(answers) != len(taken):
            _fail(taken, wire.MalformedRequest(f"the broker at {self.target} answered oddly"))
        else:
            for (_, future), answer in zip(taken, answers, strict=True):
                if future.done():
                    continue
                if isinstance(answer, BaseException):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)
        self._gather(len(taken))

    def _gather(self, answered: int) -> None:
        """After an answer to ``answered`` callers: send what waits now, or gather first."""
        if self._flush_scheduled or len(self._in_flight) >= self._max_in_flight:
            return  # a flush is on its way, or the next answer decides
        expected = answered + len(self._waiting)
        if not self._linger_s or expected < 2:
            if self._waiting:
                self._flush()
            return  # a lone sender never waits
        self._gather_target = expected
        self._gather_until = self._loop.time() + self._linger_s * min(
            1.0, expected / LINGER_FULL_AT
        )
        if len(self._waiting) >= expected:
            self._flush()
        elif self._waiting:
            self._flush_scheduled = True
            self._gather_timer = self._loop.call_at(self._gather_until, self._flush)

    def _expire(self, request_id: int) -> None:
        entry = self._in_flight.pop(request_id, None)
        if entry is None:
            return
        error = wire.BrokerDeadlineExceeded(
            f"the broker at {self.target} did not answer in time; the outcome is unknown"
        )
        _fail(entry[0], error)
        sent_at = entry[1].when() - self._timeout_s
        if self._last_answer_at >= sent_at:
            return  # answered others since this one left: alive, only slow (see the docstring)
        # A silent broker (a partition drops packets, no reset) may leave the connection open but
        # dead: drop it, so the requests behind this one fail now and the next send opens a
        # fresh one, and report the broker (suspect: sends steer elsewhere meanwhile).
        self._reset(
            wire.BrokerUnavailable(
                f"the broker at {self.target} did not answer in time; the outcome is unknown"
            )
        )
        if self._on_failure is not None:
            self._on_failure(error)
        if self._waiting and not self._flush_scheduled:
            self._flush()

    def _reset(self, error: HalfmoonError) -> None:
        """Drop the open link and fail the requests in flight on it with ``error``."""
        link, self._link = self._link, None
        if link is not None:
            link.cancel()
        self._fail_all(error, keep_waiting=True)

    def _fail_all(self, error: HalfmoonError, *, keep_waiting: bool = False) -> None:
        in_flight, self._in_flight = self._in_flight, {}
        for taken, timer in in_flight.values():
            timer.cancel()
            _fail(taken, error)
        if not keep_waiting:
            waiting, self._waiting = self._waiting, []
            _fail(waiting, error)


def _fail(taken: list[_Waiting], error: BaseException) -> None:
    for _, future in taken:
        if not future.done():
            future.set_exception(error)
