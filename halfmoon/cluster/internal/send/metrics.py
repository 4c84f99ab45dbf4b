"""How well a proxy coalesces: its internal send requests and what they carried, per broker;
and where its sends were planned (``halfmoon_proxy_send_plans_total{path}``: ``loop``, from
what the proxy knew, or ``thread``, when a broker had to be asked first).

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

_PLANS = default_registry().counter(
    "halfmoon_proxy_send_plans_total",
    "Callers' sends planned on the event loop (path=loop) or on a worker thread (path=thread:"
    " a broker had to be asked first).",
    ("path",),
)


def planned(path: str) -> None:
    _PLANS.inc(path=path)


def observer(broker: str) -> Callable[[int, int], None]:
    """What a sender calls after each request: ``(messages, callers' sends)`` it carried."""

    def observe(messages: int, sends: int) -> None:
        _REQUESTS.inc(broker=broker)
        _SENDS.inc(sends, broker=broker)
        _MESSAGES.inc(messages, broker=broker)

    return observe
