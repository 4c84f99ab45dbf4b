"""The one error a filter expression can cause."""

from __future__ import annotations

from halfmoon.errors import InvalidArgument


class FilterExpressionError(InvalidArgument):
    """A tag or SQL92 filter expression that cannot be compiled.

    ``position`` is the 0-based character offset in the expression where the
    problem was found (the length of the expression for "unexpected end").
    The message repeats it, e.g.
    ``unexpected token 'AND' at position 12: expected a value``.
    """

    code = "ILLEGAL_FILTER_EXPRESSION"

    def __init__(self, message: str, *, position: int, expression: str | None = None) -> None:
        super().__init__(message)
        self.position = position
        self.expression = expression
