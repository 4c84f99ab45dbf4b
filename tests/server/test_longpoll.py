"""Long-poll wake-ups: direct on the loop's thread, one loop wake-up per batch from other
threads."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from halfmoon.server.longpoll import ArrivalNotifier


class CountingLoop:
    """The running loop, counting the cross-thread callbacks scheduled on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.threadsafe_calls = 0

    def call_soon_threadsafe(self, callback: Any, *args: Any) -> Any:
        self.threadsafe_calls += 1
        return self._loop.call_soon_threadsafe(callback, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)


def test_wait_times_out_with_false_and_arrival_wakes_with_true() -> None:
    async def scenario() -> None:
        notifier = ArrivalNotifier(asyncio.get_running_loop())
        with notifier.waiter("orders") as waiter:
            started = time.monotonic()
            assert await waiter.wait(0.05) is False
            assert 0.04 <= time.monotonic() - started < 2
        with notifier.waiter("orders") as waiter:
            asyncio.get_running_loop().call_later(0.01, notifier.wake, "orders")
            assert await waiter.wait(5) is True
        assert notifier.parked() == 0

    asyncio.run(scenario())


def test_arrival_on_the_loop_thread_wakes_at_once_and_only_its_topic() -> None:
    async def scenario() -> None:
        loop = CountingLoop(asyncio.get_running_loop())
        notifier = ArrivalNotifier(loop)  # type: ignore[arg-type]
        with notifier.waiter("orders") as orders, notifier.waiter("refunds") as refunds:
            notifier.on_arrival("orders", 0)  # as a send appended on the loop calls it
            assert orders.future.done()
            assert not refunds.future.done()
            assert loop.threadsafe_calls == 0
            assert await orders.wait(5) is True
            assert await refunds.wait(0.01) is False

    asyncio.run(scenario())


def test_a_batch_of_arrivals_from_another_thread_costs_one_loop_wake_up() -> None:
    async def scenario() -> None:
        loop = CountingLoop(asyncio.get_running_loop())
        notifier = ArrivalNotifier(loop)  # type: ignore[arg-type]
        with (
            notifier.waiter("orders") as first,
            notifier.waiter("orders") as second,
            notifier.waiter("refunds") as other,
        ):

            def store_thread() -> None:  # a flusher making a batch of 32 visible
                for queue_id in range(32):
                    notifier.on_arrival("orders", queue_id % 4)

            thread = threading.Thread(target=store_thread)
            thread.start()
            await asyncio.to_thread(thread.join)
            assert await first.wait(5) is True
            assert await second.wait(5) is True
            assert loop.threadsafe_calls == 1
            assert await other.wait(0.01) is False
        # The next batch schedules its own wake-up.
        with notifier.waiter("orders") as again:
            threading.Thread(target=notifier.on_arrival, args=("orders", 0)).start()
            assert await again.wait(5) is True
            assert loop.threadsafe_calls == 2

    asyncio.run(scenario())


def test_shutdown_wakes_every_parked_poll_and_new_waiters_return_at_once() -> None:
    async def scenario() -> None:
        notifier = ArrivalNotifier(asyncio.get_running_loop())
        with notifier.waiter("orders") as waiter:
            asyncio.get_running_loop().call_later(0.01, notifier.wake_all)
            assert await waiter.wait(5) is True
        with notifier.waiter("orders") as late:
            assert await late.wait(5) is True

    asyncio.run(scenario())


def test_a_cancelled_poll_leaves_no_waiter_behind() -> None:
    async def scenario() -> None:
        notifier = ArrivalNotifier(asyncio.get_running_loop())

        async def poll() -> None:
            with notifier.waiter("orders") as waiter:
                await waiter.wait(30)

        task = asyncio.create_task(poll())
        while notifier.parked() == 0:
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        assert notifier.parked() == 0
        notifier.on_arrival("orders", 0)  # nobody waits: nothing to do, nothing raised

    asyncio.run(scenario())
