"""A front end's life closes every part it started, in one order, also when startup fails."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from halfmoon.broker.broker import Broker
from halfmoon.config import Config
from halfmoon.metrics import default_registry
from halfmoon.server.front_end import AmqpBacking, ClusterRole, serve_front_end
from halfmoon.server.telemetry import ClientRegistry
from halfmoon.store.config import StoreConfig
from halfmoon.store.memory import MemoryStore


class Refused(Exception):
    """What the failing registration raises."""


def loopback_config(tmp_path: Path) -> Config:
    config = Config(store=StoreConfig(data_dir=tmp_path / "data"))
    config.server.listen = "127.0.0.1:0"
    config.server.admin_listen = "127.0.0.1:0"
    config.server.amqp_listen = "127.0.0.1:0"
    return config


def refuses_connections(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as probe:
        return probe.connect_ex((host, int(port))) != 0


def test_a_startup_that_fails_late_closes_every_part_it_started(tmp_path: Path) -> None:
    """The last startup step (a proxy's registration) fails after every listener served:
    the error comes out, and nothing the life started stays behind: no port accepts, no
    metric collector is left registered, the broker's check sender is unset."""
    broker = Broker(MemoryStore(), tmp_path / "meta")
    collectors_before = list(default_registry()._collectors)  # noqa: SLF001 - the leak checked
    seen: dict[str, Any] = {}

    async def register() -> None:  # on_ready: every listener serves by now
        seen["grpc"] = config.server.listen
        seen["sender"] = broker._txns._checks._sender  # noqa: SLF001
        raise Refused("etcd refused the registration")

    config = loopback_config(tmp_path)
    role = ClusterRole(members=None, registry=ClientRegistry(), on_ready=register)  # type: ignore[arg-type]

    async def main() -> None:
        await asyncio.wait_for(
            serve_front_end(
                config, broker, tick=True, cluster=role, amqp=AmqpBacking(tmp_path / "meta")
            ),
            30,
        )

    try:
        with pytest.raises(Refused):
            asyncio.run(main())
        assert seen["sender"] is not None  # it was set while serving
        assert refuses_connections(seen["grpc"])
        assert default_registry()._collectors == collectors_before  # noqa: SLF001
        assert broker._txns._checks._sender is None  # noqa: SLF001
    finally:
        broker.close()
