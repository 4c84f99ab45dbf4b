"""A process's life: a stop signal drains within the deadline; the deadline, or a second
signal, cancels what is left and says how much; signals are captured once and restored."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from halfmoon.lifecycle import CallsInFlight, Lifecycle
from halfmoon.shutdown_signals import REPEAT_WINDOW_S
from tests.waiting import wait_until


class _Clock:
    """Real time, plus what a test skips ahead (a second signal past the copy window)."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skipped


def _in_main_thread() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("signal handlers are installed from the main thread only")


@pytest.fixture
def calls() -> Iterator[CallsInFlight]:
    yield CallsInFlight()


def _call_until(calls: CallsInFlight, release: threading.Event) -> threading.Thread:
    """A call in flight (counted) until ``release`` is set."""
    entered = threading.Event()

    def run() -> None:
        calls.enter()
        entered.set()
        try:
            release.wait(30)
        finally:
            calls.leave()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    entered.wait(5)
    return thread


def test_sigterm_drains_within_the_deadline(
    calls: CallsInFlight, caplog: pytest.LogCaptureFixture
) -> None:
    _in_main_thread()
    caplog.set_level(logging.INFO, logger="halfmoon.shutdown")
    lifecycle = Lifecycle(10.0)
    release = threading.Event()
    call = _call_until(calls, release)
    cancelled: list[bool] = []
    with lifecycle.capture_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        wait_until(lifecycle.stopping.is_set, 5, "the signal asks the life to stop")
        release.set()  # the call in flight finishes during the drain
        started = time.monotonic()
        left = lifecycle.drain(
            lambda timeout: not call.join(timeout) and not call.is_alive(),
            lambda: len(calls),
            lambda: cancelled.append(True),
        )
    assert left == 0
    assert cancelled == []
    assert time.monotonic() - started < 5
    assert len(calls) == 0
    assert any("event=drained" in r.getMessage() for r in caplog.records), caplog.text
    assert not lifecycle.forced.is_set()


def test_the_deadline_cancels_what_is_left_and_says_how_much(
    calls: CallsInFlight, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="halfmoon.shutdown")
    lifecycle = Lifecycle(0.3)
    release = threading.Event()
    _call_until(calls, release)
    _call_until(calls, release)
    cancelled: list[bool] = []
    lifecycle.request_stop()
    started = time.monotonic()
    left = lifecycle.drain(release.wait, lambda: len(calls), lambda: cancelled.append(True))
    release.set()
    assert left == 2
    assert cancelled == [True]
    assert 0.3 <= time.monotonic() - started < 5
    lines = [r.getMessage() for r in caplog.records]
    assert any("event=shutdown_deadline" in m and "calls_cancelled=2" in m for m in lines), lines


def test_a_second_signal_cancels_at_once_and_says_how_much(
    calls: CallsInFlight, caplog: pytest.LogCaptureFixture
) -> None:
    _in_main_thread()
    caplog.set_level(logging.INFO, logger="halfmoon.shutdown")
    clock = _Clock()
    lifecycle = Lifecycle(60.0, clock=clock)
    release = threading.Event()
    _call_until(calls, release)
    cancelled: list[bool] = []

    def second_signal() -> None:
        clock.skipped += REPEAT_WINDOW_S  # past the window in which a signal is a copy
        os.kill(os.getpid(), signal.SIGTERM)

    with lifecycle.capture_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        wait_until(lifecycle.stopping.is_set, 5, "the first signal drains")
        threading.Timer(0.2, second_signal).start()
        started = time.monotonic()
        left = lifecycle.drain(release.wait, lambda: len(calls), lambda: cancelled.append(True))
    release.set()
    assert left == 1
    assert cancelled == [True]
    assert time.monotonic() - started < 10  # not the 60 s grace
    lines = [r.getMessage() for r in caplog.records]
    assert any("event=shutdown_forced" in m and "calls_cancelled=1" in m for m in lines), lines


def test_on_an_event_loop_the_deadline_cancels_and_says_how_much(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="halfmoon.shutdown")
    calls = CallsInFlight()

    async def main() -> tuple[int, bool]:
        stop = asyncio.Event()
        lifecycle = Lifecycle(0.3, on_stop=stop.set)
        loop = asyncio.get_running_loop()
        cancel = asyncio.Event()

        async def held() -> None:
            calls.enter()
            try:
                await cancel.wait()
            finally:
                calls.leave()

        task = asyncio.create_task(held())
        await asyncio.sleep(0)  # it runs up to its wait: a call in flight
        with lifecycle.capture_signals(loop):
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(stop.wait(), 5)

            async def cut() -> None:
                cancel.set()
                await task

            left = await lifecycle.drain_async(asyncio.shield(task), lambda: len(calls), cut)
        return left, task.done()

    assert asyncio.run(main()) == (1, True)
    assert len(calls) == 0
    lines = [r.getMessage() for r in caplog.records]
    assert any("event=shutdown_deadline" in m and "calls_cancelled=1" in m for m in lines), lines


def test_on_an_event_loop_a_finished_drain_cancels_nothing() -> None:
    async def main() -> int:
        lifecycle = Lifecycle(10.0)
        lifecycle.request_stop()

        async def done_soon() -> None:
            await asyncio.sleep(0.01)  # a call that takes a moment to finish

        async def never() -> None:
            raise AssertionError("a drain that finished cancels nothing")

        return await lifecycle.drain_async(done_soon(), lambda: 0, never)

    assert asyncio.run(main()) == 0


def test_signals_are_captured_once_per_life_and_restored_after() -> None:
    _in_main_thread()
    before = signal.getsignal(signal.SIGTERM)
    lifecycle = Lifecycle(1.0)
    with lifecycle.capture_signals():
        assert signal.getsignal(signal.SIGTERM) is not before
        with pytest.raises(RuntimeError, match="once"), lifecycle.capture_signals():
            pass
    assert signal.getsignal(signal.SIGTERM) is before


def test_calls_are_counted_while_their_handlers_run() -> None:
    calls = CallsInFlight()
    seen: list[int] = []

    def unary(request: int) -> int:
        seen.append(len(calls))
        return request + 1

    def stream(request: int) -> Iterator[int]:
        seen.append(len(calls))
        yield request
        yield request + 1

    assert calls.counting(unary)(1) == 2
    answers = calls.counting_stream(stream)(5)
    assert next(answers) == 5
    assert len(calls) == 1  # the stream is open
    assert list(answers) == [6]
    assert seen == [1, 1]
    assert len(calls) == 0
