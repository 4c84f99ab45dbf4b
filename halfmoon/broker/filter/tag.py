"""Tag filters: ``*`` or ``TagA || TagB`` (RocketMQ's TAG expression type).

Grammar: an empty (or blank) expression or ``*`` matches every message,
including messages without a tag. Otherwise the expression is a list of tags
separated by ``||``; whitespace around each tag is ignored, tags are
case-sensitive, and a message matches when its tag is one of them. A message
without a tag matches only the match-all filter.

Decisions where RocketMQ is loose:

* empty alternatives are skipped, as RocketMQ does (``A || || B`` is
  ``A || B``, a trailing ``||`` is harmless), but an expression with no tag at
  all (``||``) is an error rather than a filter that silently matches nothing;
* ``*`` as one of several alternatives (``A || *``) means match-all.

The consume queue stores :func:`tag_hash` of each message's tag, so a reader
can skip entries whose hash is not in :attr:`TagFilter.hash_codes` without
reading the commit log; equal hashes still need :meth:`TagFilter.matches` on
the real tag, since different tags may share a hash.
"""

from __future__ import annotations

from collections.abc import Mapping

from halfmoon.broker.filter.errors import FilterExpressionError
from halfmoon.store.message import tag_hash as _store_tag_hash

__all__ = ["TagFilter", "tag_hash", "MATCH_ALL"]

MATCH_ALL = "*"
_SEPARATOR = "||"


def tag_hash(tag: str) -> int:
    """The 8-byte tag hash stored in consume-queue entries.

    The single definition lives in the store (``halfmoon.store.message.tag_hash``),
    which writes it into consume queues; filters must compute the same value.
    """
    return _store_tag_hash(tag)


class TagFilter:
    """A compiled tag expression. Build one with :meth:`TagFilter.parse`."""

    __slots__ = ("expression", "tags", "hash_codes")

    expression: str
    #: The accepted tags, or ``None`` when the filter matches everything.
    tags: frozenset[str] | None
    #: :func:`tag_hash` of each accepted tag, or ``None`` for match-all.
    hash_codes: frozenset[int] | None

    def __init__(self, expression: str, tags: frozenset[str] | None) -> None:
        self.expression = expression
        self.tags = tags
        self.hash_codes = None if tags is None else frozenset(tag_hash(t) for t in tags)

    @classmethod
    def parse(cls, expr: str) -> TagFilter:
        """Compile ``expr``; raises :class:`FilterExpressionError` if it names no tag."""
        if not isinstance(expr, str):
            raise FilterExpressionError(
                f"not a string at position 0: expected a tag expression, got {type(expr).__name__}",
                position=0,
            )
        stripped = expr.strip()
        if stripped in ("", MATCH_ALL):
            return cls(expr, None)
        tags: set[str] = set()
        for part in expr.split(_SEPARATOR):
            tag = part.strip()
            if tag == MATCH_ALL:
                return cls(expr, None)
            if tag:
                tags.add(tag)
        if not tags:
            position = len(expr) - len(expr.lstrip())
            raise FilterExpressionError(
                f"tag expression {expr!r} names no tag at position {position}: "
                "expected '*' or tags separated by '||'",
                position=position,
                expression=expr,
            )
        return cls(expr, frozenset(tags))

    @property
    def matches_all(self) -> bool:
        return self.tags is None

    def matches(self, tag: str | None) -> bool:
        """Whether a message with this tag (``None``: no tag) passes the filter."""
        tags = self.tags
        if tags is None:
            return True
        return tag is not None and tag in tags

    # -- the common message-filter interface (see ``compile_filter``) --------

    @property
    def tag_hash_codes(self) -> frozenset[int] | None:
        return self.hash_codes

    def matches_message(self, tag: str | None, properties: Mapping[str, str]) -> bool:
        return self.matches(tag)

    def __repr__(self) -> str:
        return f"TagFilter({self.expression!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TagFilter):
            return NotImplemented
        return self.tags == other.tags

    def __hash__(self) -> int:
        return hash(self.tags)
