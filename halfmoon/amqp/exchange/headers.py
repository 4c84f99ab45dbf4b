"""Headers exchange: the binding's arguments against the message's headers.

``x-match`` is ``all`` (the default: every argument present with an equal
value), ``any`` (at least one), or ``all-with-x`` / ``any-with-x`` (RabbitMQ's,
counting ``x-`` arguments too). An argument with no value (void) matches by
presence alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def matches(
    binding_key: str, arguments: Mapping[str, Any], routing_key: str, headers: Mapping[str, Any]
) -> bool:
    mode = arguments.get("x-match", "all")
    if isinstance(mode, bytes):
        mode = mode.decode(errors="replace")
    with_x = mode in ("all-with-x", "any-with-x")
    wanted = {k: v for k, v in arguments.items() if with_x or not k.startswith("x-")}
    wanted.pop("x-match", None)
    hits = (k in headers and (v is None or headers[k] == v) for k, v in wanted.items())
    if mode in ("any", "any-with-x"):
        return any(hits)
    return all(hits)
