"""The facade's event-loop fast paths, declined by a broker a network hop away.

The gRPC front end may serve a receive or an ack on
its event loop when the broker can answer without blocking (a local
broker's memory). A remote broker, or a cluster of them, never can: these
answers make the front end take its worker-thread path instead. Each is a
plain function a facade over the network takes as its method
(``ack_nowait = network_hop.ack_nowait``), the facade's signature kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from halfmoon.broker.facade import Written
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import Received

__all__ = ["ack_nowait", "receive_nowait"]


def ack_nowait(
    self: object, group: str, topic: str, receipt_handles: Sequence[str]
) -> Written[list[Exception | None]] | None:
    return None


def receive_nowait(
    self: object,
    group: str,
    topic: str,
    filter: FilterSpec,
    batch_size: int,
    invisible_ms: int,
    client_id: str = "",
    queue_id: int | None = None,
    holder: str = "",
) -> Received | None:
    return None
