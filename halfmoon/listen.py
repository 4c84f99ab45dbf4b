"""Opening a gRPC server's port, with one error whatever grpc's version does.

grpc's ``add_insecure_port`` / ``add_secure_port`` answer 0 for an address
they cannot bind in some versions and raise a bare ``RuntimeError`` in
others; either way the process should stop with one clear line (the CLI's
``cannot start: … (UNAVAILABLE)``), not a traceback.
"""

from __future__ import annotations

import errno
from collections.abc import Callable


def add_port(add: Callable[[str], int], address: str) -> int:
    """``add(address)``, the bound port; :class:`OSError` when nothing could be bound."""
    try:
        bound = add(address)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise OSError(
            errno.EADDRINUSE, f"cannot listen on {address} (address in use or not available)"
        )
    return bound
