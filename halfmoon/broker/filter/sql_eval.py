"""Evaluation of SQL92 filters: values, comparisons and three-valued logic.

A compiled filter is a tree of small closures, each taking the message's
properties and returning ``True``, ``False`` or ``None`` (SQL's UNKNOWN).
The parser builds them once with the ``make_*`` functions below; matching a
message is then a handful of Python calls, with no tree walking or dispatch.

Values: property values are strings (as on the wire); literals are strings,
ints, floats, booleans or NULL. The coercion rules follow RocketMQ, which
parses property values as numbers when they meet a number:

* ``=`` / ``<>``: string with string compares the text; a string meeting a
  number is parsed as a number (int or float, ``'10' = 10.0`` is TRUE); a
  string meeting TRUE/FALSE is read case-insensitively as ``true``/``false``.
  A string that does not parse makes the comparison UNKNOWN.
* ``< <= > >=`` and BETWEEN are numeric only: both sides are parsed as numbers
  (strings included, as RocketMQ does); when either is not a number the result
  is UNKNOWN. There is no lexicographic string ordering.
* A missing property is NULL: every comparison with it is UNKNOWN, except
  ``IS [NOT] NULL``.

AND, OR and NOT follow SQL's (Kleene's) truth tables; a filter matches a
message only when the whole expression is TRUE.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias

Value: TypeAlias = str | int | float | bool | None
Properties: TypeAlias = Mapping[str, str]
#: A compiled condition: properties -> TRUE / FALSE / UNKNOWN (None).
Condition: TypeAlias = Callable[[Properties], bool | None]

EQUALITY: Final = frozenset({"=", "<>"})
ORDERING: Final = frozenset({"<", "<=", ">", ">="})
# Any: compare() hands these two numbers, two strings or two bools; typeshed's
# comparison protocols cannot say "both of one type".
_OPS: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
#: ``c OP a`` is ``a FLIPPED[OP] c``.
FLIPPED: Final = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}

_INT = re.compile(r"[+-]?[0-9]+").fullmatch
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?").fullmatch


def parse_number(text: str) -> int | float | None:
    """A property value read as a number: ``'12'`` -> 12, ``'-1.5e3'`` -> -1500.0.

    Only plain decimal notation is accepted (no spaces, underscores, ``inf``
    or ``nan``); anything else is not a number (``None``).
    """
    if _INT(text):
        try:
            return int(text)
        except ValueError:  # beyond int()'s digit limit: still a number
            return float(text)
    if _FLOAT(text):
        return float(text)
    return None


def parse_bool(text: str) -> bool | None:
    lowered = text.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    return None


def as_number(value: Value) -> int | float | None:
    if isinstance(value, str):
        return parse_number(value)
    if value is None or isinstance(value, bool):
        return None
    return value


def as_bool(value: Value) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return parse_bool(value)
    return None


def compare(op: str, left: Value, right: Value) -> bool | None:
    """``left OP right`` under the rules above, for any two values."""
    if left is None or right is None:
        return None
    a: Value
    b: Value
    if op in ORDERING:
        a, b = as_number(left), as_number(right)
    elif isinstance(left, str) and isinstance(right, str):
        a, b = left, right
    elif isinstance(left, bool) or isinstance(right, bool):
        a, b = as_bool(left), as_bool(right)
    else:
        a, b = as_number(left), as_number(right)
    if a is None or b is None:
        return None
    return _OPS[op](a, b)


# -- conditions -----------------------------------------------------------------


def make_constant(result: bool | None) -> Condition:
    def constant(props: Properties) -> bool | None:
        return result

    return constant


def make_property_truth(name: str) -> Condition:
    """A bare property used as a condition: its value read as true/false."""

    def truth(props: Properties) -> bool | None:
        value = props.get(name)
        return None if value is None else parse_bool(value)

    return truth


def make_not(inner: Condition) -> Condition:
    def not_(props: Properties) -> bool | None:
        result = inner(props)
        return None if result is None else not result

    return not_


def make_and(parts: Sequence[Condition]) -> Condition:
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2:
        first, second = parts

        def and2(props: Properties) -> bool | None:
            a = first(props)
            if a is False:
                return False
            b = second(props)
            if b is False:
                return False
            return None if a is None or b is None else True

        return and2
    conditions = tuple(parts)

    def and_(props: Properties) -> bool | None:
        unknown = False
        for condition in conditions:
            result = condition(props)
            if result is False:
                return False
            if result is None:
                unknown = True
        return None if unknown else True

    return and_


def make_or(parts: Sequence[Condition]) -> Condition:
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2:
        first, second = parts

        def or2(props: Properties) -> bool | None:
            a = first(props)
            if a is True:
                return True
            b = second(props)
            if b is True:
                return True
            return None if a is None or b is None else False

        return or2
    conditions = tuple(parts)

    def or_(props: Properties) -> bool | None:
        unknown = False
        for condition in conditions:
            result = condition(props)
            if result is True:
                return True
            if result is None:
                unknown = True
        return None if unknown else False

    return or_


# -- predicates over operands -----------------------------------------------------
#
# An operand is a property (``Prop``) or a literal (``Const``). Builders
# specialise the common "property OP literal" shape so that a comparison costs
# one dict lookup, at most one parse of the property value and one operator call.


class Prop:
    __slots__ = ("name", "position")

    def __init__(self, name: str, position: int) -> None:
        self.name = name
        self.position = position


class Const:
    __slots__ = ("value", "position", "text")

    def __init__(self, value: Value, position: int, text: str) -> None:
        self.value = value
        self.position = position
        self.text = text


Operand: TypeAlias = Prop | Const


def _getter(operand: Operand) -> Callable[[Properties], Value]:
    if isinstance(operand, Prop):
        name = operand.name
        return lambda props: props.get(name)
    value = operand.value
    return lambda props: value


def make_comparison(op: str, left: Operand, right: Operand) -> Condition:
    """``left OP right`` for ``OP`` in ``= <> < <= > >=``."""
    if isinstance(left, Const) and isinstance(right, Const):
        return make_constant(compare(op, left.value, right.value))
    if isinstance(left, Const) and isinstance(right, Prop):
        left, right, op = right, left, FLIPPED[op]
    if isinstance(left, Prop) and isinstance(right, Const):
        return _property_vs_literal(op, left.name, right.value)
    get_left, get_right = _getter(left), _getter(right)

    def general(props: Properties) -> bool | None:
        return compare(op, get_left(props), get_right(props))

    return general


def _property_vs_literal(op: str, name: str, literal: Value) -> Condition:
    fn = _OPS[op]
    if literal is None:
        return make_constant(None)
    if isinstance(literal, str) and op in EQUALITY:

        def text(props: Properties) -> bool | None:
            value = props.get(name)
            return None if value is None else fn(value, literal)

        return text
    if isinstance(literal, bool):
        if op in ORDERING:
            return make_constant(None)

        def boolean(props: Properties) -> bool | None:
            value = props.get(name)
            if value is None:
                return None
            flag = parse_bool(value)
            return None if flag is None else fn(flag, literal)

        return boolean
    number = as_number(literal)
    if number is None:  # a non-numeric string in an ordering comparison
        return make_constant(None)

    def numeric(props: Properties) -> bool | None:
        value = props.get(name)
        if value is None:
            return None
        parsed = parse_number(value)
        return None if parsed is None else fn(parsed, number)

    return numeric


def make_between(value: Operand, low: Operand, high: Operand, negated: bool) -> Condition:
    """``value [NOT] BETWEEN low AND high``: ``low <= value AND value <= high``."""
    low_n = as_number(low.value) if isinstance(low, Const) else None
    high_n = as_number(high.value) if isinstance(high, Const) else None
    if isinstance(value, Prop) and low_n is not None and high_n is not None:
        name = value.name

        def between(props: Properties) -> bool | None:
            raw = props.get(name)
            if raw is None:
                return None
            parsed = parse_number(raw)
            if parsed is None:
                return None
            return (low_n <= parsed <= high_n) != negated

        return between
    if negated:
        return make_or([make_comparison("<", value, low), make_comparison(">", value, high)])
    return make_and([make_comparison(">=", value, low), make_comparison("<=", value, high)])


def make_in(value: Operand, items: Sequence[str], negated: bool) -> Condition:
    """``value [NOT] IN ('a', 'b')``: text membership."""
    choices = frozenset(items)
    get = _getter(value)

    def in_(props: Properties) -> bool | None:
        raw = get(props)
        if raw is None:
            return None
        if not isinstance(raw, str):  # a numeric or boolean literal on the left
            raw = _literal_text(raw)
        return (raw in choices) != negated

    return in_


_TEXT_TESTS: Final[dict[str, Callable[[str, str], bool]]] = {
    "CONTAINS": str.__contains__,
    "STARTSWITH": str.startswith,
    "ENDSWITH": str.endswith,
}


def make_text_match(value: Operand, kind: str, needle: str, negated: bool) -> Condition:
    """``value [NOT] CONTAINS|STARTSWITH|ENDSWITH 'needle'``."""
    get = _getter(value)
    test = _TEXT_TESTS[kind]

    def text_match(props: Properties) -> bool | None:
        raw = get(props)
        if raw is None:
            return None
        if not isinstance(raw, str):
            raw = _literal_text(raw)
        return test(raw, needle) != negated

    return text_match


def make_is_null(value: Operand, negated: bool) -> Condition:
    """``value IS [NOT] NULL``: never UNKNOWN."""
    if isinstance(value, Const):
        return make_constant((value.value is None) != negated)
    name = value.name

    def is_null(props: Properties) -> bool | None:
        return (props.get(name) is None) != negated

    return is_null


def _literal_text(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
