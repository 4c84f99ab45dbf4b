"""Recursive-descent parser for SQL92 filters, producing compiled conditions.

Grammar (keywords case-insensitive), loosest binding first::

    filter     := or_expr EOF
    or_expr    := and_expr ( OR and_expr )*
    and_expr   := not_expr ( AND not_expr )*
    not_expr   := NOT* predicate
    predicate  := operand [ ( = | <> | < | <= | > | >= ) operand
                          | [NOT] BETWEEN operand AND operand
                          | [NOT] IN ( string ( , string )* )
                          | [NOT] ( CONTAINS | STARTSWITH | ENDSWITH ) string
                          | IS [NOT] NULL ]
    operand    := property | string | [+|-] number | TRUE | FALSE | NULL
                | ( or_expr )

NOT binds looser than comparisons, as in SQL: ``NOT a = 1`` is
``NOT (a = 1)``. (RocketMQ's JavaCC grammar, inherited from ActiveMQ, parses
NOT as a unary operator on the operand, which turns that expression into
``(NOT a) = 1``; halfmoon follows standard SQL.) Comparisons do not chain:
``a = 1 = 2`` is an error.

Checks done at compile time, like RocketMQ: a condition must be a comparison,
a property (read as true/false), TRUE, FALSE or NULL -- not a bare number or
string; ``= NULL`` is refused (use ``IS NULL``); TRUE/FALSE/NULL cannot be
ordered with ``< <= > >=`` or BETWEEN; ``BETWEEN 5 AND 1`` is refused.
"""

from __future__ import annotations

from typing import Final

from halfmoon.broker.filter import sql_eval as ev
from halfmoon.broker.filter.errors import FilterExpressionError
from halfmoon.broker.filter.sql_lexer import (
    EOF,
    IDENT,
    KEYWORD,
    NUMBER,
    OP,
    STRING,
    Token,
    tokenize,
)

#: Deepest nesting of parentheses accepted (keeps recursion bounded).
MAX_DEPTH: Final = 100

_COMPARISONS: Final = frozenset({"=", "<>", "<", "<=", ">", ">="})
_TEXT_MATCHES: Final = frozenset({"CONTAINS", "STARTSWITH", "ENDSWITH"})
_NEGATABLE: Final = frozenset({"BETWEEN", "IN"}) | _TEXT_MATCHES
_LITERAL_KEYWORDS: Final = {"TRUE": True, "FALSE": False, "NULL": None}


class _Cond:
    """A parsed condition (anything that yields TRUE/FALSE/UNKNOWN)."""

    __slots__ = ("fn", "position")

    def __init__(self, fn: ev.Condition, position: int) -> None:
        self.fn = fn
        self.position = position


_Node = _Cond | ev.Prop | ev.Const


class Parser:
    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.tokens = tokenize(expression)
        self.index = 0
        self.depth = 0
        self.properties: set[str] = set()

    # -- entry point -------------------------------------------------------------

    def parse(self) -> ev.Condition:
        first = self.peek()
        if first.kind == EOF:
            raise self.error(
                f"empty expression at position {first.position}: expected a condition "
                "such as a > 5 AND b = 'x'",
                first.position,
            )
        node = self.or_expr()
        end = self.peek()
        if end.kind != EOF:
            expected = "expected AND, OR or end of expression"
            if end.kind == OP and end.value == ")":
                expected = "this ')' has no matching '('"
            raise self.unexpected(end, expected)
        return self.condition(node)

    # -- token helpers -------------------------------------------------------------

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.index + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        token = self.tokens[self.index]
        if token.kind != EOF:
            self.index += 1
        return token

    def at_keyword(self, *words: str) -> bool:
        token = self.peek()
        return token.kind == KEYWORD and token.value in words

    def at_op(self, *ops: str) -> bool:
        token = self.peek()
        return token.kind == OP and token.value in ops

    def expect_op(self, op: str, expected: str) -> Token:
        if not self.at_op(op):
            raise self.unexpected(self.peek(), expected)
        return self.advance()

    def error(self, message: str, position: int) -> FilterExpressionError:
        return FilterExpressionError(message, position=position, expression=self.expression)

    def unexpected(self, token: Token, expected: str) -> FilterExpressionError:
        if token.kind == EOF:
            what = "unexpected end of expression"
        else:
            what = f"unexpected {'token' if token.kind != STRING else 'string'} {token.describe()}"
        return self.error(f"{what} at position {token.position}: {expected}", token.position)

    # -- conversions ---------------------------------------------------------------

    def condition(self, node: _Node) -> ev.Condition:
        """``node`` used where TRUE/FALSE/UNKNOWN is expected."""
        if isinstance(node, _Cond):
            return node.fn
        if isinstance(node, ev.Prop):
            return ev.make_property_truth(node.name)
        value = node.value
        if value is None or isinstance(value, bool):
            return ev.make_constant(value)
        raise self.error(
            f"{node.text} at position {node.position} is not a condition: expected a "
            "comparison such as a > 5, a property, TRUE or FALSE",
            node.position,
        )

    def operand_of(self, node: _Node, role: str) -> ev.Prop | ev.Const:
        if isinstance(node, _Cond):
            raise self.error(
                f"condition at position {node.position} used as {role}: expected a "
                "property name or a literal",
                node.position,
            )
        return node

    # -- grammar -------------------------------------------------------------------

    def or_expr(self) -> _Node:
        first = self.and_expr()
        if not self.at_keyword("OR"):
            return first
        parts = [self.condition(first)]
        while self.at_keyword("OR"):
            self.advance()
            parts.append(self.condition(self.and_expr()))
        return _Cond(ev.make_or(parts), first.position)

    def and_expr(self) -> _Node:
        first = self.not_expr()
        if not self.at_keyword("AND"):
            return first
        parts = [self.condition(first)]
        while self.at_keyword("AND"):
            self.advance()
            parts.append(self.condition(self.not_expr()))
        return _Cond(ev.make_and(parts), first.position)

    def not_expr(self) -> _Node:
        start = self.peek().position
        count = 0
        while self.at_keyword("NOT"):
            self.advance()
            count += 1
        node = self.predicate()
        if count == 0:
            return node
        inner = self.condition(node)
        # NOT NOT x is x in three-valued logic too (UNKNOWN stays UNKNOWN).
        return _Cond(ev.make_not(inner) if count % 2 else inner, start)

    def predicate(self) -> _Node:
        left = self.operand()
        token = self.peek()
        if token.kind == OP and token.value in _COMPARISONS:
            self.advance()
            return self.comparison(token, left)
        if token.kind != KEYWORD:
            return left
        word = token.value
        negated = False
        if word == "NOT":
            following = self.peek(1)
            if following.kind != KEYWORD or following.value not in _NEGATABLE:
                self.advance()
                raise self.unexpected(
                    following, "expected BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT"
                )
            self.advance()
            negated = True
            word = self.peek().value
        if word == "BETWEEN":
            self.advance()
            return self.between(left, negated)
        if word == "IN":
            self.advance()
            return self.in_list(left, negated)
        if word in _TEXT_MATCHES:
            self.advance()
            value = self.operand_of(left, f"the left side of {word}")
            needle = self.string_literal(f"expected a string after {word}")
            fn = ev.make_text_match(value, str(word), needle, negated)
            return self.cond(fn, value)
        if word == "IS":
            self.advance()
            value = self.operand_of(left, "the left side of IS NULL")
            is_not = False
            if self.at_keyword("NOT"):
                self.advance()
                is_not = True
            if not self.at_keyword("NULL"):
                raise self.unexpected(
                    self.peek(),
                    "expected NULL after IS NOT"
                    if is_not
                    else "expected NULL or NOT NULL after IS",
                )
            self.advance()
            return self.cond(ev.make_is_null(value, is_not), value)
        return left

    def cond(self, fn: ev.Condition, first: ev.Prop | ev.Const) -> _Cond:
        return _Cond(fn, first.position)

    def comparison(self, op_token: Token, left_node: _Node) -> _Cond:
        op = str(op_token.value)
        left = self.operand_of(left_node, f"the left side of '{op}'")
        right = self.operand_of(self.operand(), f"the right side of '{op}'")
        for side in (left, right):
            if isinstance(side, ev.Const):
                self.check_comparable(op, side)
        return self.cond(ev.make_comparison(op, left, right), left)

    def check_comparable(self, op: str, literal: ev.Const) -> None:
        value = literal.value
        if value is None:
            hint = "use IS NULL or IS NOT NULL" if op in ev.EQUALITY else "NULL has no order"
            raise self.error(
                f"NULL cannot be compared with '{op}' at position {literal.position}: {hint}",
                literal.position,
            )
        if isinstance(value, bool) and op not in ev.EQUALITY:
            raise self.error(
                f"{literal.text} cannot be compared with '{op}' at position {literal.position}: "
                "only = and <> apply to TRUE and FALSE",
                literal.position,
            )

    def between(self, left_node: _Node, negated: bool) -> _Cond:
        value = self.operand_of(left_node, "the left side of BETWEEN")
        low = self.operand_of(self.operand(), "the lower bound of BETWEEN")
        if not self.at_keyword("AND"):
            raise self.unexpected(self.peek(), "expected AND between the bounds of BETWEEN")
        self.advance()
        high = self.operand_of(self.operand(), "the upper bound of BETWEEN")
        for side in (value, low, high):
            if isinstance(side, ev.Const):
                self.check_comparable(">=", side)
        if isinstance(low, ev.Const) and isinstance(high, ev.Const):
            low_n, high_n = ev.as_number(low.value), ev.as_number(high.value)
            if low_n is not None and high_n is not None and low_n > high_n:
                raise self.error(
                    f"empty range at position {low.position}: the lower bound {low.text} of "
                    f"BETWEEN is greater than the upper bound {high.text}",
                    low.position,
                )
        return self.cond(ev.make_between(value, low, high, negated), value)

    def in_list(self, left_node: _Node, negated: bool) -> _Cond:
        value = self.operand_of(left_node, "the left side of IN")
        self.expect_op("(", "expected '(' after IN")
        items = [self.string_literal("expected a string in the IN list (IN takes 'strings')")]
        while self.at_op(","):
            self.advance()
            items.append(self.string_literal("expected a string after ',' in the IN list"))
        self.expect_op(")", "expected ',' or ')' in the IN list")
        return self.cond(ev.make_in(value, items, negated), value)

    def string_literal(self, expected: str) -> str:
        token = self.peek()
        if token.kind != STRING:
            raise self.unexpected(token, expected)
        self.advance()
        return str(token.value)

    def operand(self) -> _Node:
        token = self.peek()
        kind = token.kind
        if kind == IDENT:
            self.advance()
            name = str(token.value)
            self.properties.add(name)
            return ev.Prop(name, token.position)
        if kind in (STRING, NUMBER):
            self.advance()
            return ev.Const(token.value, token.position, token.describe())  # type: ignore[arg-type]
        if kind == KEYWORD and token.value in _LITERAL_KEYWORDS:
            self.advance()
            return ev.Const(_LITERAL_KEYWORDS[str(token.value)], token.position, str(token.value))
        if kind == OP and token.value in ("-", "+"):
            self.advance()
            number = self.peek()
            if number.kind != NUMBER:
                raise self.unexpected(number, f"expected a number after '{token.value}'")
            self.advance()
            value = number.value
            if token.value == "-":
                value = -value  # type: ignore[operator]
            text = self.expression[token.position : number.position + len(number.text)]
            return ev.Const(value, token.position, f"'{text}'")  # type: ignore[arg-type]
        if kind == OP and token.value == "(":
            self.advance()
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise self.error(
                    f"parentheses nested too deeply at position {token.position}: "
                    f"at most {MAX_DEPTH} levels are allowed",
                    token.position,
                )
            node = self.or_expr()
            self.expect_op(")", "expected AND, OR or ')'")
            self.depth -= 1
            return node
        raise self.unexpected(token, "expected a value")


def parse(expression: str) -> tuple[ev.Condition, frozenset[str]]:
    """Compile ``expression``; returns the condition and the property names it reads."""
    parser = Parser(expression)
    condition = parser.parse()
    return condition, frozenset(parser.properties)
