"""The facade's event-loop calls of the pop path, for a broker a network hop away.

A local broker answers a receive or an ack on the event loop when it can do
so without blocking (its memory). A remote broker, or a cluster of them,
never can: its ``receive_nowait`` and ``ack_nowait`` answer a
:class:`~halfmoon.broker.facade.Pending` whose write is the plain call over
the network, which the front end makes on a worker thread. Each is a plain
function a facade over the network takes as its method (``ack_nowait =
network_hop.ack_nowait``), the facade's signature kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from halfmoon.broker.facade import Answer, Broker, Pending, acked_each, received_by_calls
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import Received

__all__ = ["ack_nowait", "receive_nowait"]


def ack_nowait(
    self: Broker, group: str, topic: str, receipt_handles: Sequence[str]
) -> Answer[list[Exception | None]]:
    return Pending(partial(acked_each, self, group, topic, list(receipt_handles)))


def receive_nowait(
    self: Broker,
    group: str,
    topic: str,
    filter: FilterSpec,
    batch_size: int,
    invisible_ms: int,
    client_id: str = "",
    queue_id: int | None = None,
    holder: str = "",
) -> Answer[Received]:
    args = (group, topic, filter, batch_size, invisible_ms, client_id, queue_id, holder)
    return Pending(partial(received_by_calls, self, *args))
