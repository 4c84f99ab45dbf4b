"""The broker side of the internal protocol: one in-process ``Broker`` served over gRPC.

Methods of ``halfmoon.internal.v1.Broker`` (generic handlers, bytes in and
out, encoded by :mod:`halfmoon.cluster.internal.wire`):

- ``Hello`` (unary): the version handshake a peer makes at connect.
- ``Call`` (unary): ``[operation, args, kwargs]`` for any facade operation
  in :data:`OPERATIONS`; the answer is the result or the error. Also
  ``send_stats``: the send requests served and the calls and messages they
  carried, from every peer (``bench/proxy_bench.py`` reads it).
- proxies' sends do not arrive here but at the broker's send listener
  (:mod:`halfmoon.cluster.internal.send.listener`, plain framed TCP, its port
  in the ``Hello`` answer's ``send_port``): many callers' sends per request,
  each batch stored all or nothing as one ``send`` would, the request answered
  once every batch is durable (one shared fsync under ``sync`` flush).
  :meth:`InternalService.store_batches` is what the listener calls; gRPC's
  per-request machinery would be most of a proxied send's cost to the broker.
- ``Events`` (bidirectional stream): the broker pushes arrival wake-ups
  (coalesced per queue), transaction check requests and lite unsubscribe
  notices; the peer answers each check batch with which checks a live
  producer took. A subscription that names topics to ``watch`` gets the
  arrivals of those only; the peer changes the set with ``["watch",
  [topic, ...]]`` and ``["unwatch", [...]]``, and a new watch is answered
  with one arrival per topic (queue -1: look again).

Every call carries the version token in its metadata (a mismatch is refused
with FAILED_PRECONDITION and ``WIRE_VERSION_MISMATCH``), and a deadline; the
work of an expired call is skipped. In-flight work is bounded by the server's
thread pool and ``maximum_concurrent_rpcs`` (beyond it: RESOURCE_EXHAUSTED).
A request that cannot be decoded, or names an unknown operation, is answered
with ``MALFORMED_REQUEST``; nothing a peer sends is executed beyond the
listed operations, and no failure of one call takes the broker down.

On a member of a broker group, a proxy's ``Call`` and its send connection's hello
carry the group epoch the proxy routes for (:mod:`halfmoon.cluster.internal.fencing`):
each request is checked by the ``fence`` given (the group role's) before
anything is done, and refused as a whole (``EPOCH_STALE``,
``MASTER_DEPOSED``) when the epoch is not the master's own.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import grpc

from halfmoon.broker.broker import Broker
from halfmoon.broker.clock import FakeClock
from halfmoon.broker.encoded import SentMessage
from halfmoon.broker.facade import Broker as BrokerFacade
from halfmoon.broker.facade import Pending, Written, operations
from halfmoon.broker.message import MessageType
from halfmoon.broker.transactions.check import CheckRequest
from halfmoon.cluster.internal import fencing, wire
from halfmoon.cluster.internal.send.requests import well_typed
from halfmoon.errors import HalfmoonError
from halfmoon.lifecycle import CallsInFlight

log = logging.getLogger("halfmoon.cluster")

# Facade members that are not plain request/answer operations: sends have their own
# method, listeners and senders are the Events stream, close belongs to the process.
NOT_CALLS = frozenset(
    {
        "close",
        "add_arrival_listener",
        "set_check_sender",
        "set_lite_unsubscribe_notifier",
        "send",
        "send_nowait",
    }
)
OPERATIONS: frozenset[str] = frozenset(
    name
    for name, value in operations(BrokerFacade).items()
    if callable(value) and name not in NOT_CALLS
)
# Half messages remembered with the peer they came through (their checks go there first).
HALF_SENDERS_REMEMBERED = 65536
CHECK_ANSWER_TIMEOUT_S = 3.0  # a check batch no peer answered in time counts as unsent
EVENT_POLL_S = 1.0  # how often an idle event stream looks whether its peer is still there


class _Subscriber:
    """One peer's Events stream: what is waiting to be pushed to it."""

    def __init__(self, peer: str, kinds: set[str], watched: set[str] | None = None) -> None:
        self.peer = peer
        self.kinds = kinds
        self.watched = watched  # None: every topic's arrivals
        self.changed = threading.Condition()
        self.arrivals: dict[tuple[str, int], None] = {}  # ordered set: one wake-up per queue
        self.outbox: list[list[Any]] = []
        self.answers: dict[int, Future[list[bool]]] = {}
        self.closed = False

    def push(self, event: list[Any]) -> None:
        with self.changed:
            self.outbox.append(event)
            self.changed.notify()

    def arrived(self, topic: str, queue_id: int) -> None:
        watched = self.watched
        if watched is not None and topic not in watched:
            return  # nobody polls it through this peer
        with self.changed:
            self.arrivals[(topic, queue_id)] = None
            self.changed.notify()

    def watch(self, topics: list[str]) -> None:
        """Arrivals of ``topics`` from now on, and one of each at once: a message may have
        arrived between the peer's last look and this watch."""
        with self.changed:
            if self.watched is None:
                return
            self.watched = self.watched | set(topics)  # replaced, never changed: read unlocked
            for topic in topics:
                self.arrivals[(topic, -1)] = None
            self.changed.notify()

    def unwatch(self, topics: list[str]) -> None:
        with self.changed:
            if self.watched is not None:
                self.watched = self.watched - set(topics)

    def next_events(self) -> list[list[Any]]:
        with self.changed:
            if not self.arrivals and not self.outbox and not self.closed:
                self.changed.wait(EVENT_POLL_S)
            events = self.outbox
            self.outbox = []
            if self.arrivals:
                events.append(["arrivals", [list(key) for key in self.arrivals]])
                self.arrivals = {}
            return events

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify()
        for answer in self.answers.values():
            if not answer.done():
                answer.set_result([])


class InternalService:
    """Serves ``broker`` to peers; ``handler()`` is what a ``grpc.server`` is given."""

    def __init__(
        self,
        broker: Broker,
        name: str,
        clock: FakeClock | None = None,
        operations: Mapping[str, Callable[..., Any]] | None = None,
        fence: Callable[[int], None] | None = None,
    ) -> None:
        self._broker = broker
        # A group member's check of a request's epoch (raises the refusal); None: no check.
        self._fence = fence
        # Operations served by another part of the process, before the facade's (cluster mode's
        # transaction groups decide across brokers: txn_groups.py).
        self._operations = dict(operations or {})
        self._name = name
        self._clock = clock  # a test clock peers may move (``AdvanceClock``); None in production
        self._token = wire.version_token()
        self._subscribers: list[_Subscriber] = []
        self._lock = threading.Lock()
        self._batch_ids = itertools.count(1)
        self._rotation = itertools.count()
        # message id of a half message -> the peer (proxy) it was sent through, newest last
        self._half_senders: OrderedDict[str, str] = OrderedDict()
        # Send requests served and what they carried, for all peers together
        # (``Call send_stats``: how well the proxies coalesce, whatever their worker count).
        self._send_stats = {"requests": 0, "calls": 0, "messages": 0}
        self.send_port: int | None = None  # the send listener's, once it listens
        self.calls = CallsInFlight()  # the gRPC calls its handlers are running
        broker.add_arrival_listener(self._on_arrival)
        broker.set_check_sender(self)
        broker.set_lite_unsubscribe_notifier(self._on_lite_unsubscribe)

    def close(self) -> None:
        self._broker.set_check_sender(None)
        self._broker.set_lite_unsubscribe_notifier(None)
        with self._lock:
            subscribers, self._subscribers = self._subscribers, []
        for subscriber in subscribers:
            subscriber.close()

    def handler(self) -> grpc.GenericRpcHandler:
        # Counted while they run: what the process's shutdown waits for, then cancels.
        unary, stream = self.calls.counting, self.calls.counting_stream
        methods: dict[str, grpc.RpcMethodHandler] = {
            "Hello": grpc.unary_unary_rpc_method_handler(unary(self._hello)),
            "Call": grpc.unary_unary_rpc_method_handler(unary(self._call)),
            "Events": grpc.stream_stream_rpc_method_handler(stream(self._events)),
        }
        if self._clock is not None:
            methods["AdvanceClock"] = grpc.unary_unary_rpc_method_handler(self._advance_clock)
        return grpc.method_handlers_generic_handler(wire.SERVICE, methods)

    # -- unary methods ---------------------------------------------------------------------------

    def _check_version(self, context: grpc.ServicerContext) -> dict[str, Any]:
        """The call's metadata, once its version token is checked."""
        headers = dict(context.invocation_metadata())
        sent = headers.get(wire.VERSION_HEADER)
        if sent != self._token:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{wire.WireVersionMismatch.code}: this broker speaks internal protocol "
                f"{self._token}, the peer {sent or 'sent no version'}; run the same halfmoon "
                "release on proxies and brokers",
            )
        return headers

    def check_epoch(self, sent: int | None) -> None:
        """Refuse (raise) a request meant for epoch ``sent`` when this broker's group fence
        does; nothing to check without an epoch or outside a group."""
        if sent is not None and self._fence is not None:
            self._fence(sent)

    def _hello(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._check_version(context)
        return wire.encode(self.hello_answer())

    def hello_answer(self) -> dict[str, Any]:
        """Who answers, and where its send listener is (a proxy's sends go there when given)."""
        answer: dict[str, Any] = {"broker": self._name, "version": self._token}
        if self.send_port is not None:
            answer["send_port"] = self.send_port
        return answer

    def version_refusal(self, sent: object) -> wire.WireVersionMismatch | None:
        """The refusal of a peer that sent the version token ``sent``; None when it matches."""
        if sent == self._token:
            return None
        return wire.WireVersionMismatch(
            f"this broker speaks internal protocol {self._token}, the peer "
            f"{sent or 'sent no version'}; run the same halfmoon release on proxies and brokers"
        )

    def _call(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        headers = self._check_version(context)
        try:
            self.check_epoch(fencing.parse_epoch(headers.get(fencing.EPOCH_HEADER)))
            operation, args, kwargs = _call_parts(wire.decode(request))
            _check_deadline(context)
            return wire.encode(self._invoke(operation, args, kwargs, context))
        except HalfmoonError as error:
            return wire.encode(error)
        except Exception as exc:  # noqa: BLE001 - a bug answers this call, never the process
            log.exception("event=internal_call_failed")
            return wire.encode(HalfmoonError(f"internal error in the broker: {exc}"))

    def _invoke(
        self, operation: str, args: list[Any], kwargs: dict[str, Any], context: grpc.ServicerContext
    ) -> object:
        if operation == "config":
            return self._broker.config
        if operation == "send_stats":
            return dict(self._send_stats)
        method: Callable[..., Any]
        if operation in self._operations:
            method = self._operations[operation]
        elif operation in OPERATIONS:
            method = getattr(self._broker, operation)
        else:
            raise wire.MalformedRequest(f"the broker has no operation {operation!r}")
        try:
            inspect.signature(method).bind(*args, **kwargs)
        except TypeError as exc:
            raise wire.MalformedRequest(f"{operation}: {exc}") from None
        result = method(*args, **kwargs)
        if isinstance(result, Pending):  # a write left to its answer: made here, in this thread
            result = result.write()
        if isinstance(result, Written):  # the remote side waits for durability here
            _wait_durable([result.durable], context.time_remaining())
            return result.result
        return result

    def store_batches(
        self, batches: list[list[SentMessage]], epoch: int | None = None
    ) -> tuple[list[object], list[Future[None]]]:
        """Store the batches of one send request (counted in ``send_stats``), not waiting:
        an answer per batch and the futures that complete once they are durable. A request
        meant for an ``epoch`` the group fence refuses stores nothing: that refusal is every
        batch's answer."""
        if epoch is not None and self._fence is not None:
            try:
                self._fence(epoch)
            except HalfmoonError as refusal:
                return [refusal] * len(batches), []
        stats = self._send_stats
        stats["requests"] += 1  # unlocked: a statistic, one lost increment is harmless
        stats["calls"] += len(batches)
        stats["messages"] += sum(len(batch) for batch in batches)
        return self._store_batches(batches)

    def remember_half_senders(
        self,
        batches: list[list[SentMessage]],
        answers: list[object],
        peer: str | None,
    ) -> None:
        """Which peer each stored half message came through: the producer that sent it is
        connected there, so its checks are offered to that peer first."""
        if not peer:
            return
        with self._lock:
            for messages, answer in zip(batches, answers, strict=True):
                if not isinstance(answer, list):
                    continue
                for message, result in zip(messages, answer, strict=False):
                    if message.message_type is MessageType.TRANSACTION:
                        self._half_senders[result.message_id] = str(peer)
            while len(self._half_senders) > HALF_SENDERS_REMEMBERED:
                self._half_senders.popitem(last=False)

    def _store_batches(
        self, batches: list[list[SentMessage]]
    ) -> tuple[list[object], list[Future[None]]]:
        """Every batch in one append when all are valid (the store's cost per message, one
        fsync wait); when that fails, batch by batch, so each caller gets its own answer."""
        if len(batches) > 1 and all(well_typed(m) for batch in batches for m in batch):
            try:
                written = self._broker.send_nowait([m for batch in batches for m in batch]).write()
            except Exception:  # noqa: BLE001 - some batch is bad: which one is found below
                pass  # (a send is all or nothing: nothing was stored)
            else:
                answers: list[object] = []
                start = 0
                for batch in batches:
                    answers.append(written.result[start : start + len(batch)])
                    start += len(batch)
                return answers, [written.durable]
        answers = []
        durable: list[Future[None]] = []
        for messages in batches:
            if not all(well_typed(m) for m in messages):
                answers.append(wire.MalformedRequest("a message with ill-typed fields"))
                continue
            try:
                one = self._broker.send_nowait(messages).write()
            except HalfmoonError as error:
                answers.append(error)
                continue
            except Exception as exc:  # noqa: BLE001 - one batch fails, not the request
                log.exception("event=internal_send_failed")
                answers.append(HalfmoonError(f"internal error in the broker: {exc}"))
                continue
            answers.append(one.result)
            durable.append(one.durable)
        return answers, durable

    def _advance_clock(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        assert self._clock is not None
        self._check_version(context)
        try:
            ms = wire.decode(request)
            if not isinstance(ms, int):
                raise wire.MalformedRequest("AdvanceClock takes milliseconds")
        except HalfmoonError as error:
            return wire.encode(error)
        return wire.encode(self._clock.advance(ms))

    # -- the Events stream -----------------------------------------------------------------------

    def _events(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        self._check_version(context)
        try:
            opening = wire.decode(next(requests))
            kinds = set(opening["subscribe"])
            peer = str(opening.get("peer", ""))
            watched = opening.get("watch")
            watched = None if watched is None else {str(topic) for topic in watched}
        except (StopIteration, HalfmoonError, KeyError, TypeError):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST: bad subscription")
        subscriber = _Subscriber(peer, kinds, watched)
        with self._lock:
            self._subscribers.append(subscriber)
        reader = threading.Thread(
            target=self._read_answers, args=(subscriber, requests), daemon=True
        )
        reader.start()
        try:
            yield wire.encode([["subscribed", self._name]])
            while context.is_active() and not subscriber.closed:
                events = subscriber.next_events()
                if events:
                    yield wire.encode(events)
        finally:
            with self._lock:
                if subscriber in self._subscribers:
                    self._subscribers.remove(subscriber)
            subscriber.close()

    def _read_answers(self, subscriber: _Subscriber, requests: Iterator[bytes]) -> None:
        """From the peer: check answers ``[batch_id, [took, ...]]``, and changes of the watched
        topics ``["watch" | "unwatch", [topic, ...]]``."""
        try:
            for raw in requests:
                batch_id, took = wire.decode(raw)
                if batch_id == "watch":
                    subscriber.watch([str(topic) for topic in took])
                    continue
                if batch_id == "unwatch":
                    subscriber.unwatch([str(topic) for topic in took])
                    continue
                answer = subscriber.answers.pop(batch_id, None)
                if answer is not None and not answer.done():
                    answer.set_result([bool(t) for t in took])
        except Exception:  # noqa: BLE001 - the stream ended or the peer sent garbage
            pass
        finally:
            subscriber.close()

    def _listening(self, kind: str) -> list[_Subscriber]:
        with self._lock:
            return [s for s in self._subscribers if kind in s.kinds]

    def _on_arrival(self, topic: str, queue_id: int) -> None:
        for subscriber in self._listening("arrivals"):
            subscriber.arrived(topic, queue_id)

    def _on_lite_unsubscribe(self, client_id: str, group: str, topic: str, lite: str) -> None:
        for subscriber in self._listening("lite"):
            subscriber.push(["lite", [client_id, group, topic, lite]])

    def send_checks(self, checks: Sequence[CheckRequest]) -> list[bool]:
        """The broker's check sender. A check goes first to the peer its half message came
        through (where its producer is connected), if that peer is still here; then each peer
        holding producer streams in turn is offered the checks no earlier peer's producers took
        (a producer of the same group on another proxy). False for a check nobody took."""
        took = [False] * len(checks)
        peers = self._listening("checks")
        if not peers:
            return took
        by_peer = {subscriber.peer: subscriber for subscriber in peers}
        with self._lock:
            senders = [self._half_senders.get(c.message.message_id) for c in checks]
        for peer in dict.fromkeys(p for p in senders if p in by_peer):
            own = [i for i, sender in enumerate(senders) if sender == peer]
            self._offer(by_peer[str(peer)], checks, own, took)
        start = next(self._rotation) % len(peers)
        for subscriber in peers[start:] + peers[:start]:
            waiting = [i for i, done in enumerate(took) if not done]
            if not waiting:
                break
            self._offer(subscriber, checks, waiting, took)
        return took

    def _offer(
        self,
        subscriber: _Subscriber,
        checks: Sequence[CheckRequest],
        indices: list[int],
        took: list[bool],
    ) -> None:
        """Push ``checks[indices]`` to one peer and mark in ``took`` those its producers took."""
        batch_id = next(self._batch_ids)
        answer: Future[list[bool]] = Future()
        subscriber.answers[batch_id] = answer
        subscriber.push(["checks", batch_id, [checks[i] for i in indices]])
        try:
            answered = answer.result(timeout=CHECK_ANSWER_TIMEOUT_S)
        except FutureTimeout:
            subscriber.answers.pop(batch_id, None)
            log.warning("event=check_answer_timeout peer=%s", subscriber.peer)
            return
        for index, ok in zip(indices, answered, strict=False):
            took[index] = ok


def _check_deadline(context: grpc.ServicerContext) -> None:
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise wire.BrokerDeadlineExceeded("the call's deadline passed before its work started")


def _wait_durable(futures: Sequence[Future[None]], remaining: float | None) -> None:
    for future in futures:
        try:
            future.result(timeout=remaining)
        except FutureTimeout:
            raise wire.BrokerDeadlineExceeded(
                "written, but not yet durable when the call's deadline passed"
            ) from None
        except HalfmoonError:
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. an fsync failure
            raise HalfmoonError(f"the store could not make the write durable: {exc}") from None


def _call_parts(request: object) -> tuple[str, list[Any], dict[str, Any]]:
    if (
        isinstance(request, list)
        and len(request) == 3
        and isinstance(request[0], str)
        and isinstance(request[1], list)
        and isinstance(request[2], dict)
        and all(isinstance(k, str) for k in request[2])
    ):
        return request[0], request[1], request[2]
    raise wire.MalformedRequest("a Call is [operation, args, kwargs]")
