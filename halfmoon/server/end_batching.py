"""EndTransactions decided together: one broker call, one store append, one fsync to wait for.

A producer answering thousands of transaction checks sends thousands of
EndTransactions, dozens in flight at once. Decided one by one, each is a
lock, an append and a durable future of its own. :class:`EndBatcher` does
for decisions what the store's group commit does for the flush: while the
decisions it last handed to the broker wait for their fsync, the
EndTransactions that arrive queue up; once that fsync is done (or at the
next loop turn when nothing is in flight) all of them are decided with one
``Broker.end_transactions_nowait`` call, and the transaction service appends
their records in one store call. Queueing costs a decision no time: arriving
while an fsync runs, it would have waited for the next fsync anyway. Nothing
waits on a timer. Under ``async`` flush nothing is ever in flight, so a batch
is what arrived during one loop turn. A batch holds at most
:data:`MAX_BATCH` decisions.

Each answer keeps its own guarantees: its own error (a bad id fails alone),
its own result, and a durable future covering its record; the server
acknowledges it only once that future holds, so under ``sync`` flush an
acknowledged decision is on disk, as before. A failed append fails the whole
batch and changed nothing (the store's append is all or nothing).

The broker decides at once only what is memory and an append (a pending
transaction outside a group, a recent decision); a decision that needs an index
lookup, or a broker a network hop away, it answers with a ``Pending``, which
the batcher writes on a worker thread by itself, outside the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from halfmoon.broker.facade import Answer, Pending, Written
from halfmoon.broker.transactions import EndRequest, EndResult
from halfmoon.errors import HalfmoonError

EndMany = Callable[[Sequence[EndRequest]], list[Answer[EndResult] | HalfmoonError]]


# Decisions per broker call at most (the records of one store append).
MAX_BATCH = 1024


class EndBatcher:
    """Loop thread only: queues EndTransactions while a batch is in flight, decides them at once.

    :meth:`end` answers once the decision is durable: the batcher waits for the batch's durable
    future once and wakes every caller from that one callback (a wrapper per caller was one
    cross-thread loop wake-up each, 7 % of the server's time in a flood of answers).
    """

    def __init__(self, end_many: EndMany) -> None:
        self._end_many = end_many
        self._waiting: list[tuple[EndRequest, asyncio.Future[Written[EndResult]]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False  # a flush is queued on the loop
        self._in_flight = 0  # durable futures of handed-over batches still running
        self._writing: set[asyncio.Task[None]] = set()  # Pending answers being written
        self.batches = 0  # broker calls made
        self.decisions = 0  # requests they carried

    def end(self, request: EndRequest) -> asyncio.Future[Written[EndResult]]:
        """The decision's answer once decided with the others of its batch and durable."""
        loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[Written[EndResult]] = loop.create_future()
        self._waiting.append((request, future))
        if not self._scheduled and not self._in_flight:
            self._scheduled = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._scheduled = False
        waiting = self._waiting[:MAX_BATCH]
        del self._waiting[:MAX_BATCH]
        if not waiting:
            return
        self.batches += 1
        self.decisions += len(waiting)
        try:
            results = self._end_many([request for request, _ in waiting])
        except Exception as exc:  # noqa: BLE001 - the append failed: every request of it did
            for _, future in waiting:
                if not future.done():
                    future.set_exception(exc)
            results = []
        # Callers per durable future still running (one per batch from the local broker).
        running: dict[int, tuple[Future[None], list[Waiter]]] = {}
        for (_, future), result in zip(waiting, results, strict=bool(results)):
            if isinstance(result, HalfmoonError):
                if not future.done():
                    future.set_exception(result)
            elif isinstance(result, Pending):
                task = asyncio.ensure_future(_write(future, result))
                self._writing.add(task)
                task.add_done_callback(self._writing.discard)
            elif result.durable.done():
                _answer(future, result, result.durable)
            else:
                running.setdefault(id(result.durable), (result.durable, []))[1].append(
                    (future, result)
                )
        for durable, answers in running.values():
            self._wait_for(durable, answers)
        self._next()

    def _next(self) -> None:
        if self._waiting and not self._in_flight and not self._scheduled:
            self._scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _wait_for(self, durable: Future[None], answers: list[Waiter]) -> None:
        self._in_flight += 1
        loop = self._loop
        assert loop is not None

        def landed(_: object) -> None:  # the flusher's thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
                loop.call_soon_threadsafe(self._landed, durable, answers)

        durable.add_done_callback(landed)

    def _landed(self, durable: Future[None], answers: list[Waiter]) -> None:
        """A batch is durable (loop thread): answer its callers, decide what queued meanwhile."""
        self._in_flight -= 1
        for future, result in answers:
            _answer(future, result, durable)
        self._next()


# A caller's future and the decision it is answered with once durable.
Waiter = tuple[asyncio.Future[Written[EndResult]], Written[EndResult]]


def _answer(
    future: asyncio.Future[Written[EndResult]], result: Written[EndResult], durable: Future[None]
) -> None:
    if future.done():  # the caller went away; its decision stands
        return
    error = durable.exception()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


async def _write(future: asyncio.Future[Written[EndResult]], pending: Pending[EndResult]) -> None:
    """A decision the broker could not make at once: written (on a worker thread), answered
    once durable."""
    try:
        written = await pending.written()
        if not written.durable.done():
            await asyncio.wrap_future(written.durable)
    except Exception as exc:  # noqa: BLE001 - the caller's error, raised where it awaits
        if not future.done():
            future.set_exception(exc)
        return
    _answer(future, written, written.durable)
