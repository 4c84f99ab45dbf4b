"""Message filters: which messages a subscription receives.

Two expression types, as in RocketMQ:

* ``TAG``: ``*`` or ``TagA || TagB`` (:class:`TagFilter`), decidable from the
  tag hash stored in the consume queue (:func:`tag_hash`);
* ``SQL92``: conditions over user properties such as
  ``region = 'eu' AND amount BETWEEN 10 AND 100`` (:class:`SqlFilter`).

:func:`compile_filter` turns a subscription's (type, expression) pair into a
:class:`MessageFilter`. Everything here is pure computation: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from halfmoon.broker.filter.errors import FilterExpressionError
from halfmoon.broker.filter.sql92 import SqlFilter
from halfmoon.broker.filter.tag import TagFilter, tag_hash
from halfmoon.errors import InvalidArgument

__all__ = [
    "FilterExpressionError",
    "MessageFilter",
    "SqlFilter",
    "TagFilter",
    "compile_filter",
    "tag_hash",
]


class MessageFilter(Protocol):
    """What the broker needs from a compiled subscription filter."""

    @property
    def tag_hash_codes(self) -> frozenset[int] | None:
        """Tag hashes a message must have to match, or ``None`` if the hash cannot tell."""
        ...

    def matches_message(self, tag: str | None, properties: Mapping[str, str]) -> bool:
        """Whether a message with this tag and these user properties is delivered."""
        ...


def compile_filter(kind: str, expression: str) -> MessageFilter:
    """Compile a subscription filter.

    ``kind`` is ``"TAG"`` or ``"SQL92"`` (case-insensitive; an empty kind means
    TAG, as in RocketMQ). Raises :class:`FilterExpressionError` for a bad
    expression and :class:`~halfmoon.errors.InvalidArgument` for an unknown kind.
    """
    normalized = (kind or "TAG").upper()
    if normalized == "TAG":
        return TagFilter.parse(expression)
    if normalized in ("SQL92", "SQL"):
        return SqlFilter.compile(expression)
    raise InvalidArgument(f"unknown filter type {kind!r}: expected 'TAG' or 'SQL92'")
