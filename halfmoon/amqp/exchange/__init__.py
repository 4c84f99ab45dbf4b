"""Exchange types: each module says whether a binding matches a published message.

``matches(binding_key, binding_arguments, routing_key, headers)`` is the
whole of an exchange type; :data:`TYPES` maps the AMQP type name to it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from halfmoon.amqp.exchange import direct, fanout, headers, topic

Matcher = Callable[[str, Mapping[str, Any], str, Mapping[str, Any]], bool]

TYPES: dict[str, Matcher] = {
    "direct": direct.matches,
    "fanout": fanout.matches,
    "topic": topic.matches,
    "headers": headers.matches,
}

__all__ = ["TYPES", "Matcher"]
