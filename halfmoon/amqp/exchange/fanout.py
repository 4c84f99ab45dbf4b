"""Fanout exchange: every binding matches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def matches(
    binding_key: str, arguments: Mapping[str, Any], routing_key: str, headers: Mapping[str, Any]
) -> bool:
    return True
