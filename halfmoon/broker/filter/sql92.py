"""SQL92 filters over message properties (RocketMQ's SQL92 expression type).

``SqlFilter.compile("region = 'eu' AND amount >= 100")`` parses the
expression once into a tree of closures (see :mod:`.sql_parser` for the
grammar and :mod:`.sql_eval` for the value and NULL rules); ``matches`` then
evaluates it against a message's user properties in a few microseconds.

Property values are strings on the wire. Compared with a number they are
parsed as one (``amount >= 100`` matches ``{"amount": "250"}`` and
``{"amount": "250.5"}``); a value that does not parse, or a missing property,
makes the comparison UNKNOWN, and a filter matches only when the expression
is TRUE. So ``NOT (a = 1)`` does not match a message without ``a``.

The pseudo-property ``TAGS`` refers to the message tag in
:meth:`SqlFilter.matches_message`, as in RocketMQ where the tag travels as a
property of that name.
"""

from __future__ import annotations

from collections.abc import Mapping

from halfmoon.broker.filter.errors import FilterExpressionError
from halfmoon.broker.filter.sql_parser import parse

__all__ = ["SqlFilter", "TAGS_PROPERTY"]

#: The property name under which the message tag is visible to SQL filters.
TAGS_PROPERTY = "TAGS"


class SqlFilter:
    """A compiled SQL92 filter. Build one with :meth:`SqlFilter.compile`."""

    __slots__ = ("expression", "properties", "_condition", "_reads_tags")

    expression: str
    #: Names of the properties the expression reads.
    properties: frozenset[str]

    def __init__(self, expression: str) -> None:
        if not isinstance(expression, str):
            raise FilterExpressionError(
                f"not a string at position 0: expected an SQL92 expression, "
                f"got {type(expression).__name__}",
                position=0,
            )
        condition, properties = parse(expression)
        self.expression = expression
        self.properties = properties
        self._condition = condition
        self._reads_tags = TAGS_PROPERTY in properties

    @classmethod
    def compile(cls, expr: str) -> SqlFilter:
        """Parse ``expr``; raises :class:`FilterExpressionError` with the position on bad syntax."""
        return cls(expr)

    def evaluate(self, properties: Mapping[str, str]) -> bool | None:
        """The expression's value: ``True``, ``False`` or ``None`` (UNKNOWN)."""
        return self._condition(properties)

    def matches(self, properties: Mapping[str, str]) -> bool:
        """Whether the expression is TRUE for these properties."""
        return self._condition(properties) is True

    # -- the common message-filter interface (see ``compile_filter``) --------

    @property
    def tag_hash_codes(self) -> frozenset[int] | None:
        """Always ``None``: an SQL filter cannot be decided from the tag hash."""
        return None

    def matches_message(self, tag: str | None, properties: Mapping[str, str]) -> bool:
        if self._reads_tags and tag is not None:
            properties = {**properties, TAGS_PROPERTY: tag}
        return self._condition(properties) is True

    def __repr__(self) -> str:
        return f"SqlFilter({self.expression!r})"
