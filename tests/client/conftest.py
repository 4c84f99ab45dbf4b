"""Real ``halfmoon serve`` processes for the client tests (the server tests' fixture, reused)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable
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
]

T = TypeVar("T")
_names = itertools.count()


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    """Run one test coroutine on a fresh event loop, bounded by ``timeout``."""
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"
