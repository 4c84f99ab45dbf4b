"""Direct exchange: the routing key equals the binding key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def matches(
    binding_key: str, arguments: Mapping[str, Any], routing_key: str, headers: Mapping[str, Any]
) -> bool:
    return binding_key == routing_key
