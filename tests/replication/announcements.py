"""Calls a broker group's master the moment etcd announces it, as a proxy would.

:class:`AnnouncementProbe` watches the group's routing entry
(``brokers/<group>``) from a thread of its own and, on every PUT, calls the
endpoint it names at once (a facade ``Call`` meant for the announced epoch,
as a proxy's requests are), without waiting or retrying: a proxy that hears
of a master routes to it straight away. What each announced master answered
is kept: None for an answer, else the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading

from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.coordination.keys import ClusterKeys
from halfmoon.cluster.internal import wire
from halfmoon.cluster.internal.connection import BrokerConnection
from halfmoon.errors import HalfmoonError


class AnnouncementProbe:
    def __init__(self, coordinator: str, cluster: str, group: str) -> None:
        self.coordinator = coordinator
        self.key = ClusterKeys(cluster).broker(group)
        self.answers: list[tuple[int, str | None]] = []  # (epoch announced, error or None)
        self._watching = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._main, name="announcements", daemon=True)

    def __enter__(self) -> AnnouncementProbe:
        self._thread.start()
        assert self._watching.wait(10), "could not watch the group's routing entry"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(10)

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        client = EtcdClient.from_url(self.coordinator)
        try:
            found = await client.get(self.key)
            start = found.mod_revision if found is not None else 0
            _, revision = await client.get_prefix(self.key)
            async for batch in client.watch_prefix(self.key, max(start, revision) + 1):
                self._watching.set()
                for event in batch.events:
                    if event.kind == "PUT" and event.kv.key == self.key:
                        self.answers.append(self._call(json.loads(event.kv.value)))
        except asyncio.CancelledError:
            pass
        finally:
            with contextlib.suppress(Exception):
                await client.close()

    @staticmethod
    def _call(route: dict[str, object]) -> tuple[int, str | None]:
        epoch = int(route.get("epoch", 0))  # type: ignore[call-overload]
        connection = BrokerConnection(str(route["endpoint"]), epoch=epoch)
        try:
            answer = wire.decode(
                connection.send_raw("Call", wire.encode(["config", [], {}]), timeout_s=5)
            )
        except HalfmoonError as error:
            return epoch, f"{error.code}: {error.message}"
        finally:
            connection.close()
        if isinstance(answer, HalfmoonError):
            return epoch, f"{answer.code}: {answer.message}"
        return epoch, None
