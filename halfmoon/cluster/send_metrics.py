"""How well a proxy coalesces: its internal send requests and what they carried, per broker.

``halfmoon_proxy_internal_send_messages_total / halfmoon_proxy_internal_send_requests_total``
is the number of messages per internal request, the figure that decides a
broker's cost per message for single-message sends (each request has a fixed
cost, shared by the messages it carries). On the proxy's ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Callable

from halfmoon.metrics import default_registry

_REQUESTS = default_registry().counter(
    "halfmoon_proxy_internal_send_requests_total",
    "Internal send requests this process made to each broker (coalesced sends).",
    ("broker",),
)
_SENDS = default_registry().counter(
    "halfmoon_proxy_internal_send_calls_total",
    "Callers' sends (SendMessage calls) the internal send requests carried, per broker.",
    ("broker",),
)
_MESSAGES = default_registry().counter(
    "halfmoon_proxy_internal_send_messages_total",
    "Messages the internal send requests carried, per broker.",
    ("broker",),
)


def observer(broker: str) -> Callable[[int, int], None]:
    """What a sender calls after each request: ``(messages, callers' sends)`` it carried."""

    def observe(messages: int, sends: int) -> None:
        _REQUESTS.inc(broker=broker)
        _SENDS.inc(sends, broker=broker)
        _MESSAGES.inc(messages, broker=broker)

    return observe
