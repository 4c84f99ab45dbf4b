"""The server's settings moved to :mod:`halfmoon.config` (the server imports that module)."""

from halfmoon.config import ServerConfig, parse_host_port

__all__ = ["ServerConfig", "parse_host_port"]
