"""halfmoon's network front ends: the RocketMQ 5 gRPC endpoint and the admin API.

Importing the package is cheap: the gRPC pieces load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from halfmoon.config import ServerConfig

__all__ = ["ClientRegistry", "MessagingServicer", "ServerConfig", "run", "serve"]

_LAZY = {
    "ClientRegistry": "halfmoon.server.telemetry",
    "MessagingServicer": "halfmoon.server.grpc_service",
    "run": "halfmoon.server.app",
    "serve": "halfmoon.server.app",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'halfmoon.server' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
