"""Polls with deadlines: how a test waits for something another process or thread does.

A test never sleeps a fixed time before it asserts; it polls for the state it
expects and fails, naming what it waited for, when the deadline passes. The
deadline is generous (a shared machine is slow); the poll ends as soon as the
state is there, so a quiet machine does not pay for the margin.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll ``predicate`` until it returns something truthy, and return that; fail with
    ``what`` once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def time_until(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.005
) -> float:
    """:func:`wait_until` for a test that measures the wait: the seconds it took."""
    started = time.monotonic()
    wait_until(predicate, timeout, what, interval)
    return time.monotonic() - started


async def until(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """:func:`wait_until` inside a coroutine: the loop keeps running between polls.

    ``predicate`` may return an awaitable (``lambda: client.get(key)``); its result is
    what is tested and returned."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
