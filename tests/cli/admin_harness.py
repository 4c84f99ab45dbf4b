"""A real admin API on a free loopback port, served from a thread, over a real Broker.

Shared by the admin API tests and the CLI tests (which call it from
``python -m halfmoon`` subprocesses). The broker runs over the in-memory
store, its metadata in a temporary directory.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from aiohttp import web

from halfmoon.broker.broker import Broker
from halfmoon.config import Config
from halfmoon.metrics import MetricsRegistry
from halfmoon.server.admin import create_admin_app
from halfmoon.store.memory import MemoryStore


class AdminServer:
    """``with AdminServer(tmp_path) as admin:`` → ``admin.url``, ``admin.broker``."""

    def __init__(self, metadata_dir: Path, config: Config | None = None) -> None:
        self.config = config or Config()
        self.store = MemoryStore()
        self.broker = Broker(self.store, metadata_dir, self.config.broker)
        self.registry = MetricsRegistry()
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="admin-api", daemon=True
        )
        self._runner: web.AppRunner | None = None

    def __enter__(self) -> AdminServer:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        port = future.result(timeout=10)
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def _start(self) -> int:
        app = create_admin_app(self.broker, self.config, registry=self.registry)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
        self.broker.close()
        self.store.close()

    def call(
        self, method: str, path: str, body: Any = None, raw: bytes | None = None
    ) -> tuple[int, Any]:
        """(HTTP status, decoded JSON or text) of one request."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, payload, kind = (
                    response.status,
                    response.read(),
                    response.headers.get_content_type(),
                )
        except urllib.error.HTTPError as exc:
            status, payload, kind = exc.code, exc.read(), exc.headers.get_content_type()
        if kind == "application/json":
            return status, json.loads(payload)
        return status, payload.decode()
