"""The values the broker facade's operations answer with (:mod:`halfmoon.broker.facade`)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any, Concatenate, Generic, ParamSpec, TypeAlias, TypeVar, overload

from halfmoon.broker.message import MessageType, MessageView
from halfmoon.store.api import GetStatus

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Written(Generic[T]):
    """A ``*_nowait`` answer: ``result`` once written; ``durable`` completes when it may be
    acknowledged (after the fsync under ``sync`` flush, at once under ``async``).

    Awaited on an event loop, the result once durable (no loop wake-up when durable already).
    :class:`Pending` is the answer of a write that has not happened yet; both have
    :meth:`written` (on a loop) and :meth:`write` (off one), so a caller treats them alike."""

    result: T
    durable: Future[None]

    def __await__(self) -> Generator[Any, None, T]:
        if not self.durable.done():
            yield from asyncio.wrap_future(self.durable).__await__()
        self.durable.result()
        return self.result

    async def written(self) -> Written[T]:
        """This answer (written already)."""
        return self

    def write(self) -> Written[T]:
        """This answer (written already)."""
        return self


class Pending(Generic[T]):
    """A ``*_nowait`` answer whose write has not happened: the implementation could not write
    without blocking (a topic to create on disk, an index lookup, a network hop), so the call
    returned at once and the write happens when the answer is asked for.

    ``blocking`` writes and returns the :class:`Written`; off an event loop :meth:`write` calls
    it. On a loop, awaiting the answer (or :meth:`written`) awaits ``on_loop`` when the
    implementation has one (a coroutine of the result once durable: a proxy's send, coalesced
    on the loop, no thread), else runs ``blocking`` on the loop's default executor."""

    __slots__ = ("blocking", "on_loop")

    def __init__(
        self,
        blocking: Callable[[], Written[T]],
        on_loop: Callable[[], Awaitable[T]] | None = None,
    ) -> None:
        self.blocking = blocking
        self.on_loop = on_loop

    @staticmethod
    def of_durable(
        plain: Callable[[], T], on_loop: Callable[[], Awaitable[T]] | None = None
    ) -> Pending[T]:
        """The answer of a broker whose calls return once durable (one a network hop away):
        ``plain`` called when asked for, its answer durable already; ``on_loop`` as above."""
        return Pending(lambda: Written(plain(), ALREADY_DURABLE), on_loop)

    def __await__(self) -> Generator[Any, None, T]:
        if self.on_loop is not None:
            return (yield from self.on_loop().__await__())
        written = yield from self._in_thread().__await__()
        return (yield from written.__await__())

    async def written(
        self, run: Callable[[Callable[[], Written[T]]], Awaitable[Written[T]]] | None = None
    ) -> Written[T]:
        """The answer once written, the write awaited on the loop (or a worker thread:
        ``run``'s, a front end's own workers, else the loop's default executor)."""
        if self.on_loop is not None:
            return Written(await self.on_loop(), ALREADY_DURABLE)
        if run is not None:
            return await run(self.blocking)
        return await self._in_thread()

    def write(self) -> Written[T]:
        """Write now, blocking the caller (never on an event loop)."""
        return self.blocking()

    def _in_thread(self) -> asyncio.Future[Written[T]]:
        return asyncio.get_running_loop().run_in_executor(None, self.blocking)


# What a ``*_nowait`` call answers: written now, or a write still to make (see Pending).
Answer: TypeAlias = Written[T] | Pending[T]


def _completed() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future


# What an answer that needs no flush waits for (nothing written, or durable already).
ALREADY_DURABLE = _completed()


@overload
def waits_for(
    nowait: Callable[Concatenate[Any, P], Answer[T]],
) -> Callable[Concatenate[Any, P], T]: ...


@overload
def waits_for(
    nowait: Callable[Concatenate[Any, P], Answer[T]], answer: Callable[[T], R]
) -> Callable[Concatenate[Any, P], R]: ...


def waits_for(
    nowait: Callable[Concatenate[Any, P], Answer[Any]],
    answer: Callable[[Any], Any] | None = None,
) -> Callable[Concatenate[Any, P], Any]:
    """The plain form of the ``*_nowait`` operation ``nowait`` (same parameters): its result
    (or ``answer`` of it) once durable. An implementation writes the one form and declares
    the other with this: ``end_transaction = waits_for(end_transaction_nowait, state)``."""

    def plain(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> Any:
        written = nowait(self, *args, **kwargs).write()
        written.durable.result()
        return written.result if answer is None else answer(written.result)

    return _renamed(plain, nowait, nowait.__name__.removesuffix("_nowait"))


def deferred(
    plain: Callable[Concatenate[Any, P], T],
) -> Callable[Concatenate[Any, P], Pending[T]]:
    """The ``*_nowait`` form of ``plain`` for a broker whose calls block until durable (one
    a network hop away): a :class:`Pending` that calls ``plain`` when asked for, on a worker
    thread when awaited on an event loop."""

    def nowait(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> Pending[T]:
        return Pending.of_durable(partial(plain, self, *args, **kwargs))

    return _renamed(nowait, plain, plain.__name__ + "_nowait")


def _renamed(made: F, source: Callable[..., Any], name: str) -> F:
    """``made`` named ``name`` in ``source``'s class, with ``source``'s parameters."""
    made.__name__ = name
    made.__qualname__ = source.__qualname__.rsplit(".", 1)[0] + "." + name
    made.__module__ = source.__module__
    parameters = inspect.signature(source).replace(return_annotation=inspect.Signature.empty)
    made.__signature__ = parameters  # type: ignore[attr-defined]
    return made


@dataclass(frozen=True)
class QueueStatus:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_store_timestamp: int | None  # None for an empty queue
    perm: str


@dataclass(frozen=True)
class QueueProgress:
    group: str
    topic: str
    queue_id: int
    committed_offset: int
    max_offset: int
    lag: int
    inflight: int
    retrying: int = 0  # of those in flight, the ones delivered more than once
    # What a receive would hand out now: never delivered, or in flight and visible again
    # (requeued, timed out); AMQP's message count.
    ready: int = 0


@dataclass(frozen=True)
class QueueRoute:
    topic: str
    queue_id: int
    perm: str  # "rw", "r", "w" or "-"
    accepted_types: list[MessageType]
    broker: str = ""  # in cluster mode, the broker owning the queue ("": this broker)


@dataclass
class PullResult:
    status: GetStatus
    messages: list[MessageView]
    next_offset: int
    min_offset: int
    max_offset: int
