"""The facade's event-loop fast paths, declined by a broker a network hop away.

The gRPC front end may serve a send, an end of transaction, a receive or an
ack on its event loop when the broker can answer without blocking (a local
broker's memory). A remote broker, or a cluster of them, never can: these
answers make the front end take its worker-thread path instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import OutgoingMessage, Received


class NetworkHop:
    """Mixed into a facade whose every call crosses the network."""

    def sends_cheaply(self, messages: Sequence[OutgoingMessage]) -> bool:
        return False

    def transaction_ends_cheaply(self, transaction_id: str) -> bool:
        return False

    def ack_nowait(
        self, group: str, topic: str, receipt_handles: Sequence[str]
    ) -> list[Exception | None] | None:
        return None

    def receive_nowait(
        self,
        group: str,
        topic: str,
        filter: FilterSpec,
        batch_size: int,
        invisible_ms: int,
        client_id: str = "",
        queue_id: int | None = None,
    ) -> Received | None:
        return None
