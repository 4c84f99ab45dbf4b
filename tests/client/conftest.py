"""Real ``halfmoon serve`` processes for the client tests (the server tests' fixture, reused)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tests.server.conftest import ServerProcess, free_port, server, server_factory, wait_until

__all__ = [
    "ServerProcess",
    "free_port",
    "server",
    "server_factory",
    "wait_until",
    "run",
    "unique",
    "eventually",
]

T = TypeVar("T")
_names = itertools.count()


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    """Run one test coroutine on a fresh event loop, bounded by ``timeout``."""
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


async def eventually(
    predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05
) -> object:
    """Poll ``predicate`` on the loop until truthy; fail with ``what`` at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
