"""The plain and ``*_nowait`` forms of an operation made from the other
(halfmoon/broker/facade_types.py): an implementation writes one form and declares the other;
and the ``*_nowait`` answers, written now (``Written``) or left to be (``Pending``), which a
caller on an event loop awaits and one off it writes, the same way whichever it got."""

from __future__ import annotations

import asyncio
import inspect
import threading
from concurrent.futures import Future
from typing import TypeVar

import pytest

from halfmoon.broker.facade_types import ALREADY_DURABLE, Pending, Written, deferred, waits_for

T = TypeVar("T")


class Ends:
    def __init__(self) -> None:
        self.durable: Future[None] = Future()
        self.calls: list[tuple[str, int]] = []

    def end_nowait(self, group_id: str, actions: int | None = None) -> Written[list[str]]:
        self.calls.append((group_id, actions or 0))
        return Written([group_id], self.durable)

    end = waits_for(end_nowait)
    end_count = waits_for(end_nowait, len)

    def plain(self, name: str, *, twice: bool = False) -> str:
        return name * (2 if twice else 1)

    plain_nowait = deferred(plain)


def test_the_plain_form_returns_only_once_durable() -> None:
    ends = Ends()
    returned = threading.Event()
    answers: list[object] = []

    def call() -> None:
        answers.append(ends.end("g1", actions=2))
        returned.set()

    caller = threading.Thread(target=call)
    caller.start()
    assert not returned.wait(0.2)  # written, not yet durable: still waiting
    assert ends.calls == [("g1", 2)]
    ends.durable.set_result(None)
    assert returned.wait(5)
    caller.join()
    assert answers == [["g1"]]
    assert ends.end_count("g2") == 1  # an answer made of the result


def test_the_plain_form_raises_what_the_durable_future_raises() -> None:
    ends = Ends()
    ends.durable.set_exception(OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        ends.end("g1")


def test_each_made_form_has_its_name_and_the_other_forms_parameters() -> None:
    assert (Ends.end.__name__, Ends.plain_nowait.__name__) == ("end", "plain_nowait")
    assert list(inspect.signature(Ends.end).parameters) == ["self", "group_id", "actions"]
    assert inspect.signature(Ends.plain_nowait).parameters == (
        inspect.signature(Ends.plain).parameters
    )


def test_the_nowait_form_of_a_blocking_call_calls_it_only_when_asked_for() -> None:
    calls: list[str] = []

    class Remote:
        def plain(self, name: str, *, twice: bool = False) -> str:
            calls.append(name)
            return name * (2 if twice else 1)

        plain_nowait = deferred(plain)

    answer = Remote().plain_nowait("ab", twice=True)
    assert isinstance(answer, Pending) and calls == []  # the caller's loop was not held
    written = answer.write()
    assert written.result == "abab" and written.durable is ALREADY_DURABLE
    assert calls == ["ab"]


def test_a_written_answer_awaited_is_its_result_once_durable() -> None:
    durable: Future[None] = Future()
    written = Written([1, 2], durable)

    async def scenario() -> list[int]:
        waiting = asyncio.ensure_future(_awaited(written))
        await asyncio.sleep(0)
        assert not waiting.done()  # written, not yet durable
        durable.set_result(None)
        return await waiting

    assert asyncio.run(scenario()) == [1, 2]
    assert asyncio.run(_awaited(Written("done", ALREADY_DURABLE))) == "done"
    failed: Future[None] = Future()
    failed.set_exception(OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        asyncio.run(_awaited(Written("x", failed)))


def test_a_pending_answer_awaited_writes_on_a_worker_thread() -> None:
    loop_thread: list[threading.Thread] = []
    wrote_in: list[threading.Thread] = []

    def blocking() -> Written[str]:
        wrote_in.append(threading.current_thread())
        durable: Future[None] = Future()
        durable.set_result(None)
        return Written("stored", durable)

    async def scenario() -> tuple[str, Written[str]]:
        loop_thread.append(threading.current_thread())
        return await _awaited(Pending(blocking)), await Pending(blocking).written()

    result, written = asyncio.run(scenario())
    assert result == "stored" and written.result == "stored"
    assert len(wrote_in) == 2 and loop_thread[0] not in wrote_in


def test_a_pending_answer_with_a_coroutine_awaits_it_on_the_loop_and_writes_off_it() -> None:
    # A proxy's send: on the loop its own sender (no thread), off it the blocking one.
    on_loop: list[str] = []

    async def streamed() -> str:
        on_loop.append("streamed")
        return "via the stream"

    def answer() -> Pending[str]:
        return Pending.of_durable(lambda: "via the blocking sender", streamed)

    async def scenario() -> tuple[str, Written[str]]:
        return await _awaited(answer()), await answer().written()

    result, written = asyncio.run(scenario())
    assert (result, written.result) == ("via the stream", "via the stream")
    assert written.durable is ALREADY_DURABLE and on_loop == ["streamed", "streamed"]
    assert answer().write().result == "via the blocking sender"
    assert on_loop == ["streamed", "streamed"]  # writing off the loop made no coroutine


async def _awaited(answer: Written[T] | Pending[T]) -> T:
    return await answer
