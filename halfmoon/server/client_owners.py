"""Which user a client id belongs to: the first to sign a request with it, while it is in use.

A client id (the ``x-mq-client-id`` header) names a client's session: its
telemetry stream (transaction checks; consumeMessageDirectly commands, which
carry a message), its lite subscriptions and auto-renewed receipts, and
NotifyClientTermination ends them all. The client chooses it, so with
authentication on the first user to sign a request with a client id owns it
until no request has named it for ``idle_s`` (a session's idle time: clients
heartbeat every few seconds); another user's request naming it is refused
FORBIDDEN before any handler runs (:class:`halfmoon.server.rpc_guard.RpcGuard`).
Claims live in the process that checks them: each proxy worker has its own.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from halfmoon.server.telemetry import SESSION_IDLE_SECONDS


class ClientOwners:
    def __init__(
        self, idle_s: float = SESSION_IDLE_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.idle_s = idle_s
        self._clock = clock
        self._lock = threading.Lock()
        # client id -> (access key, last use); oldest use first, so expiry pops from the front.
        self._owners: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def claim(self, client_id: str, access_key: str) -> bool:
        """True when ``access_key`` may use ``client_id`` (now its owner's, renewed); False
        when another user used it within ``idle_s``."""
        now = self._clock()
        with self._lock:
            held = self._owners.get(client_id)
            if held is not None and held[0] != access_key and now - held[1] < self.idle_s:
                return False
            self._owners[client_id] = (access_key, now)
            self._owners.move_to_end(client_id)
            while self._owners:
                oldest = next(iter(self._owners.values()))
                if now - oldest[1] < self.idle_s:
                    break
                self._owners.popitem(last=False)
        return True

    def __len__(self) -> int:
        return len(self._owners)
