"""Where a failover's time goes: etcd's changes and the processes' log lines, on one clock.

:class:`KeyTimeline` watches a prefix in etcd from a thread of its own and
notes the wall-clock time each key was put or deleted (etcd's watch latency
on loopback is a millisecond or two). :func:`logged_at` finds when a process
logged a line (the ``asctime`` every halfmoon log line starts with). A
failover bench puts both beside the kill and the first acknowledged send.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from halfmoon.cluster.coordination.etcd import EtcdClient

# "2026-12-01 22:45:59,123 INFO halfmoon.cluster ..." (logging's default asctime, local time)
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@dataclass(frozen=True)
class KeyEvent:
    at: float  # time.time()
    kind: str  # PUT or DELETE
    key: str


class KeyTimeline:
    """Every PUT and DELETE under ``prefix`` from :meth:`start` on, with when it was seen."""

    def __init__(self, coordinator: str, prefix: str) -> None:
        self.coordinator = coordinator
        self.prefix = prefix
        self.events: list[KeyEvent] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._watching = threading.Event()
        self._thread = threading.Thread(target=self._main, name="key-timeline", daemon=True)

    def start(self) -> KeyTimeline:
        self._thread.start()
        if not self._watching.wait(10):
            raise RuntimeError(f"could not watch {self.prefix} in etcd")
        return self

    def close(self) -> None:
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(10)

    def first_after(self, moment: float, kind: str, key: str) -> float | None:
        """When ``key`` (under the prefix, without it) first saw ``kind`` after ``moment``."""
        with self._lock:
            found = [e.at for e in self.events if e.at > moment and e.kind == kind and e.key == key]
        return min(found) if found else None

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        client = EtcdClient.from_url(self.coordinator)
        try:
            _, revision = await client.get_prefix(self.prefix)
            async for batch in client.watch_prefix(self.prefix, revision + 1):
                self._watching.set()
                now = time.time()
                with self._lock:
                    self.events.extend(
                        KeyEvent(now, e.kind, e.kv.key.removeprefix(self.prefix))
                        for e in batch.events
                    )
        except asyncio.CancelledError:
            pass
        finally:
            with contextlib.suppress(Exception):
                await client.close()


def logged_at(lines: Iterable[str], pattern: str, after: float) -> float | None:
    """When the first line containing ``pattern`` was logged after ``after`` (time.time())."""
    for line in list(lines):
        if pattern not in line:
            continue
        match = _STAMP.match(line)
        if match is None:
            continue
        stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        # asctime has milliseconds: a line logged in the same millisecond as ``after`` counts.
        if stamp >= after - 0.001:
            return stamp
    return None
