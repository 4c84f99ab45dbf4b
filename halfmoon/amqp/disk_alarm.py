"""The disk alarm: publishers are blocked while the disk is nearly full (RabbitMQ's alarm).

Every ``CHECK_EVERY_S`` the alarm asks how many bytes are free where messages
are stored (``halfmoon serve``: its data directory; a cluster proxy: the least
free of the live brokers, as they report it in etcd) and compares that with
``server.amqp_disk_free_limit_bytes``. When it falls below, the alarm is set
and every AMQP connection is told (:meth:`AmqpConnection.alarm_changed`):
as in RabbitMQ, a connection is blocked when it next publishes: that publish
is handled, then the server stops reading from its socket and, if the client asked for the
``connection.blocked`` capability, sends Connection.Blocked. When the free
space is back above the limit, blocked connections get Connection.Unblocked
and are read again. Connections that
only consume are never blocked. A limit of 0 turns the alarm off; an unknown
free space (no broker reported yet, the directory unreadable) leaves the alarm
as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger("halfmoon.amqp")

CHECK_EVERY_S = 1.0
REASON = "low on disk"


class DiskAlarm:
    def __init__(
        self,
        free_bytes: Callable[[], int | None],
        limit_bytes: int,
        on_change: Callable[[bool], None],
        *,
        check_every_s: float = CHECK_EVERY_S,
    ) -> None:
        self._free_bytes = free_bytes
        self.limit_bytes = limit_bytes
        self._on_change = on_change
        self._every_s = check_every_s
        self.active = False
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Check once now (a server starting on a full disk blocks its first publisher),
        then every ``check_every_s``."""
        if self.limit_bytes <= 0:
            return
        await self.check()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="disk alarm")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._every_s)
            try:
                await self.check()
            except Exception:  # noqa: BLE001 - a failed check must not end the next ones
                log.exception("event=amqp_disk_check_failed")

    async def check(self) -> None:
        free = await asyncio.get_running_loop().run_in_executor(None, self._free_bytes)
        if free is None:
            return
        active = free < self.limit_bytes
        if active == self.active:
            return
        self.active = active
        log.warning(
            "event=amqp_disk_alarm %s free_bytes=%d limit_bytes=%d",
            "set" if active else "cleared",
            free,
            self.limit_bytes,
        )
        self._on_change(active)
