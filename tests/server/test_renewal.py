"""Auto-renewal bookkeeping (RenewalBook) and rounds (Renewer) with a fake clock and broker."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from typing import Any

import pytest

from halfmoon.broker.clock import FakeClock
from halfmoon.broker.groups import RetryPolicy
from halfmoon.broker.receipt import InvalidReceiptHandle
from halfmoon.config import ServerConfig
from halfmoon.server.renewal import RENEW_BATCH, RenewalBook, Renewer

CONFIG = ServerConfig()  # RocketMQ's defaults: 60 s, renew 10 s ahead, 1/3/5/10/30/60 min, 3 h
INVISIBLE = 60_000


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def book(clock: FakeClock) -> RenewalBook:
    return RenewalBook(CONFIG, clock.now_ms)


def test_a_handle_is_due_renew_ahead_before_it_becomes_visible(
    book: RenewalBook, clock: FakeClock
) -> None:
    assert book.track("c1", "g", "t", "h0", INVISIBLE, 1)
    clock.advance(INVISIBLE - 10_000 - 1)
    assert book.due(clock.now_ms(), 10) == []
    clock.advance(1)
    (item,) = book.due(clock.now_ms(), 10)
    assert (item.handle, book.plan(item, clock.now_ms())) == ("h0", 60_000)
    assert book.due(clock.now_ms(), 10) == []  # taken off the timer until renewed


def test_renewals_follow_rocketmq_renew_strategy_then_stop_after_max_time(
    book: RenewalBook, clock: FakeClock
) -> None:
    book.track("c1", "g", "t", "h0", INVISIBLE, 1)
    plans = []
    while True:
        due_at = book.next_due()
        assert due_at is not None
        clock.set(due_at)
        (item,) = book.due(clock.now_ms(), 10)
        plan = book.plan(item, clock.now_ms())
        plans.append(plan)
        if plan is None:
            break
        book.renewed(item, f"h{len(plans)}", plan, clock.now_ms())
    minutes = [p // 60_000 for p in plans[:-1]]
    assert minutes[:7] == [1, 3, 5, 10, 30, 60, 60]
    assert plans[-1] is None and clock.now_ms() - item.first_ms >= 3 * 3600 * 1000


def test_release_by_original_handle_gives_the_current_one_and_stops_renewing(
    book: RenewalBook, clock: FakeClock
) -> None:
    book.track("c1", "g", "t", "h0", INVISIBLE, 1)
    clock.advance(INVISIBLE - 10_000)
    (item,) = book.due(clock.now_ms(), 10)
    book.renewed(item, "h1", 60_000, clock.now_ms())
    assert book.release("c2", "g", "h0") is None  # another client's
    assert book.release("c1", "other", "h0") is None  # another group's
    released = book.release("c1", "g", "h0")
    assert released is item and released.handle == "h1" and len(book) == 0
    clock.advance(3_600_000)
    assert book.due(clock.now_ms(), 10) == []


def test_failures_are_retried_then_given_up_and_invalid_handles_at_once(
    book: RenewalBook, clock: FakeClock
) -> None:
    book.track("c1", "g", "t", "a", INVISIBLE, 1)
    book.track("c1", "g", "t", "b", INVISIBLE, 1)
    clock.advance(INVISIBLE - 10_000)
    a, b = sorted(book.due(clock.now_ms(), 10), key=lambda i: i.original)
    book.failed(b, InvalidReceiptHandle("acked elsewhere"), clock.now_ms())
    assert not b.live and len(book) == 1
    for attempt in range(CONFIG.renew_max_retries):
        book.failed(a, OSError("busy"), clock.now_ms())
        assert a.live
        clock.advance(int(CONFIG.renew_schedule_period * 1000))
        assert book.due(clock.now_ms(), 10) == [a], attempt
    book.failed(a, OSError("busy"), clock.now_ms())
    assert not a.live and len(book) == 0


def test_drop_client_forgets_only_its_handles(book: RenewalBook) -> None:
    book.track("c1", "g", "t", "a", INVISIBLE, 1)
    book.track("c1", "g2", "t", "b", INVISIBLE, 1)
    book.track("c2", "g", "t", "c", INVISIBLE, 1)
    assert sorted(i.original for i in book.drop_client("c1")) == ["a", "b"]
    assert len(book) == 1 and book.release("c1", "g", "a") is None
    assert book.release("c2", "g", "c") is not None


def test_the_book_is_bounded(clock: FakeClock) -> None:
    book = RenewalBook(dataclasses.replace(CONFIG, renew_max_handles=3), clock.now_ms)
    assert [book.track("c", "g", "t", f"h{i}", INVISIBLE, 1) for i in range(5)] == [
        True,
        True,
        True,
        False,
        False,
    ]
    book.release("c", "g", "h0")
    assert book.track("c", "g", "t", "h9", INVISIBLE, 1)


def test_released_entries_do_not_pile_up_on_the_timer(book: RenewalBook) -> None:
    for i in range(10_000):
        book.track("c", "g", "t", f"h{i}", INVISIBLE, 1)
        book.release("c", "g", f"h{i}")
    assert len(book._heap) <= 2 * len(book) + 1024 + 1


# -- Renewer rounds against a fake broker -------------------------------------------


@dataclasses.dataclass
class View:
    receipt_handle: str
    invisible_duration_ms: int = INVISIBLE
    delivery_attempt: int = 1


class FakeBroker:
    def __init__(self) -> None:
        self.changes: list[tuple[str, int]] = []
        self.invalid: set[str] = set()
        self.gate: asyncio.Event | None = None
        self.counter = 0

    def change_invisible_duration(self, group: str, topic: str, handle: str, ms: int) -> str:
        if handle in self.invalid:
            raise InvalidReceiptHandle("gone")
        self.changes.append((handle, ms))
        self.counter += 1
        return f"{handle.split('/')[0]}/{self.counter}"

    def get_group(self, name: str) -> Any:
        return dataclasses.make_dataclass("G", [("retry_policy", RetryPolicy)])(
            RetryPolicy.customized((5_000,))
        )


def make_renewer(clock: FakeClock, broker: FakeBroker, streams: set[str]) -> Renewer:
    async def call(fn: Any, *args: Any) -> Any:
        if broker.gate is not None:
            await broker.gate.wait()
        return fn(*args)

    return Renewer(broker, CONFIG, call, streams.__contains__, clock.now_ms)


def run(coroutine_fn: Any) -> None:
    asyncio.run(coroutine_fn())


def test_renewer_renews_due_handles_and_ack_uses_the_current_one(clock: FakeClock) -> None:
    async def scenario() -> None:
        broker = FakeBroker()
        renewer = make_renewer(clock, broker, {"c1"})
        renewer.track("c1", "g", "t", [View("a"), View("b", INVISIBLE * 2)])
        renewer.close()  # drive rounds by hand
        clock.advance(INVISIBLE - 10_000)
        await renewer.round()
        assert broker.changes == [("a", 60_000)]
        assert await renewer.current("c1", "g", "a") == "a/1"
        assert await renewer.current("c1", "g", "a") == "a"  # released: passes through
        assert await renewer.current("c1", "g", "unknown") == "unknown"

    run(scenario)


def test_release_waits_for_a_renewal_in_flight(clock: FakeClock) -> None:
    async def scenario() -> None:
        broker = FakeBroker()
        broker.gate = asyncio.Event()
        renewer = make_renewer(clock, broker, {"c1"})
        renewer.track("c1", "g", "t", [View("a")])
        renewer.close()
        clock.advance(INVISIBLE)
        renewing = asyncio.create_task(renewer.round())
        await asyncio.sleep(0)
        acking = asyncio.create_task(renewer.current("c1", "g", "a"))
        await asyncio.sleep(0)
        assert not acking.done()
        broker.gate.set()
        await renewing
        assert await acking == "a/1"

    run(scenario)


def test_many_due_handles_are_renewed_in_batches(clock: FakeClock) -> None:
    async def scenario() -> None:
        broker = FakeBroker()
        renewer = make_renewer(clock, broker, {"c1"})
        count = RENEW_BATCH * 2 + 3
        renewer.track("c1", "g", "t", [View(f"h{i}") for i in range(count)])
        renewer.close()
        calls = 0
        inner = renewer._call

        async def counting(fn: Any, *args: Any) -> Any:
            nonlocal calls
            calls += 1
            return await inner(fn, *args)

        renewer._call = counting
        clock.advance(INVISIBLE)
        await renewer.round()
        assert len(broker.changes) == count and calls == 3

    run(scenario)


def test_renewing_stops_with_the_group_retry_backoff_after_max_time(clock: FakeClock) -> None:
    async def scenario() -> None:
        broker = FakeBroker()
        renewer = make_renewer(clock, broker, {"c1"})
        renewer.track("c1", "g", "t", [View("a", delivery_attempt=2)])
        renewer.close()
        while len(renewer.book):
            due = renewer.book.next_due()
            assert due is not None
            clock.set(due)
            await renewer.round()
        assert broker.changes[-1][1] == 5_000  # the group's retry backoff
        assert [ms for _, ms in broker.changes[:-1]][:3] == [60_000, 180_000, 300_000]

    run(scenario)


def test_terminated_client_handles_become_visible_soon(clock: FakeClock) -> None:
    async def scenario() -> None:
        broker = FakeBroker()
        renewer = make_renewer(clock, broker, {"c1", "c2"})
        renewer.track("c1", "g", "t", [View("a"), View("b")])
        renewer.track("c2", "g", "t", [View("c")])
        renewer.close()
        renewer._closed = False  # let _clear run without the loop task
        renewer.client_terminated("c1")
        for _ in range(5):
            await asyncio.sleep(0)
        assert sorted(broker.changes) == [("a", 1_000), ("b", 1_000)]
        assert len(renewer.book) == 1

    run(scenario)


def test_a_closed_stream_releases_handles_unless_the_client_reconnects(clock: FakeClock) -> None:
    async def scenario() -> None:
        broker = FakeBroker()
        streams = {"back", "gone"}
        renewer = make_renewer(clock, broker, streams)
        renewer.track("gone", "g", "t", [View("a")])
        renewer.track("back", "g", "t", [View("b")])
        streams.discard("gone")
        renewer.close()
        renewer._closed = False
        renewer.stream_closed("gone")
        renewer.stream_closed("back")
        await renewer.round()
        assert broker.changes == [] and len(renewer.book) == 2  # within the grace period
        clock.advance(int(CONFIG.renew_schedule_period * 1000))
        await renewer.round()
        for _ in range(5):
            await asyncio.sleep(0)
        assert broker.changes == [("a", 1_000)] and len(renewer.book) == 1

    run(scenario)


def test_a_client_without_a_telemetry_stream_is_not_renewed_for(clock: FakeClock) -> None:
    async def scenario() -> None:
        renewer = make_renewer(clock, FakeBroker(), {"c1"})
        renewer.track("nostream", "g", "t", [View("a")])
        assert len(renewer.book) == 0
        renewer.close()

    run(scenario)


def test_disabled_renewal_tracks_nothing(clock: FakeClock) -> None:
    broker = FakeBroker()
    renewer = Renewer(
        broker,
        dataclasses.replace(CONFIG, auto_renew=False),
        functools.partial(asyncio.sleep, 0),
        lambda _: True,
        clock.now_ms,
    )
    renewer.track("c1", "g", "t", [View("a")])
    assert len(renewer.book) == 0 and not renewer.enabled
