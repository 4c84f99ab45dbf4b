"""SQL92 filters: grammar, value rules, three-valued logic, errors with positions."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from halfmoon.broker.filter import FilterExpressionError, SqlFilter
from halfmoon.broker.filter.sql_parser import MAX_DEPTH


def ev(expr: str, **props: str) -> bool | None:
    """The three-valued result of ``expr`` over ``props``."""
    return SqlFilter.compile(expr).evaluate(props)


def match(expr: str, **props: str) -> bool:
    return SqlFilter.compile(expr).matches(props)


def error(expr: str) -> FilterExpressionError:
    with pytest.raises(FilterExpressionError) as info:
        SqlFilter.compile(expr)
    err = info.value
    assert err.code == "ILLEGAL_FILTER_EXPRESSION"
    assert f"at position {err.position}" in err.message
    assert err.expression == expr
    return err


# -- API ---------------------------------------------------------------------------


def test_compile_keeps_source_text_and_property_names() -> None:
    f = SqlFilter.compile("a > 5 AND b.c = 'x'")
    assert f.expression == "a > 5 AND b.c = 'x'"
    assert f.properties == frozenset({"a", "b.c"})
    assert repr(f) == "SqlFilter(\"a > 5 AND b.c = 'x'\")"


def test_matches_only_when_true() -> None:
    f = SqlFilter.compile("a = 'x'")
    assert f.matches({"a": "x"})
    assert not f.matches({"a": "y"})
    assert not f.matches({})
    assert f.evaluate({}) is None


# -- comparisons -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "value", "expected"),
    [
        ("a = 5", "5", True),
        ("a = 5", "5.0", True),
        ("a = 5.0", "5", True),
        ("a = 5", "6", False),
        ("a <> 5", "6", True),
        ("a <> 5", "5", False),
        ("a > 5", "10", True),  # numeric, not lexicographic ("10" < "5" as text)
        ("a > 5", "5", False),
        ("a >= 5", "5", True),
        ("a < 5", "-7", True),
        ("a <= 5", "5.0", True),
        ("a < 1e3", "999.5", True),
        ("a > -3", "-2", True),
        ("a < -3", "-2", False),
        ("a > +3", "4", True),
        ("a > .5", "0.6", True),
        ("a > 10L", "11", True),
        ("a = 9007199254740993", "9007199254740993", True),  # no float rounding
        ("a = 9007199254740993", "9007199254740992", False),
    ],
)
def test_numeric_comparison(expr: str, value: str, expected: bool) -> None:
    assert ev(expr, a=value) is expected


@pytest.mark.parametrize(
    ("expr", "value", "expected"),
    [
        ("a = 'x'", "x", True),
        ("a = 'x'", "X", False),
        ("a <> 'x'", "y", True),
        ("a = '5'", "5.0", False),  # text with text compares the text
        ("a = ''", "", True),
        ("a = 'it''s'", "it's", True),
        ("a = ''''", "'", True),
    ],
)
def test_string_comparison(expr: str, value: str, expected: bool) -> None:
    assert ev(expr, a=value) is expected


def test_literal_may_be_on_the_left() -> None:
    assert ev("5 < a", a="6") is True
    assert ev("5 >= a", a="6") is False
    assert ev("'x' = a", a="x") is True


def test_property_with_property() -> None:
    assert ev("a = b", a="x", b="x") is True
    assert ev("a = b", a="1", b="1.0") is False  # both text: compared as text
    assert ev("a < b", a="9", b="10") is True  # ordering is numeric
    assert ev("a < b", a="x", b="10") is None
    assert ev("a = b", a="x") is None


def test_ordering_strings_is_numeric_or_unknown() -> None:
    assert ev("a > '5'", a="10") is True
    assert ev("a > 'abc'", a="10") is None
    assert ev("a > 'abc'") is None


def test_boolean_literals() -> None:
    assert ev("a = TRUE", a="true") is True
    assert ev("a = TRUE", a="TRUE") is True
    assert ev("a = true", a="false") is False
    assert ev("a = FALSE", a="false") is True
    assert ev("a <> FALSE", a="true") is True
    assert ev("a = TRUE", a="yes") is None


def test_literal_with_literal_is_folded() -> None:
    assert ev("1 = 1") is True
    assert ev("1 < 1") is False
    assert ev("'5' = 5") is True
    assert ev("'abc' > 3") is None
    assert ev("TRUE = 'true'") is True
    assert ev("TRUE = 1") is None


# -- type mismatches and missing properties ---------------------------------------------


@pytest.mark.parametrize("value", ["abc", "", " 5", "5 ", "1_000", "inf", "nan", "0x10", "5e"])
def test_non_numeric_value_against_number_is_unknown(value: str) -> None:
    for op in ("=", "<>", "<", "<=", ">", ">="):
        assert ev(f"a {op} 3", a=value) is None
    assert ev("a BETWEEN 1 AND 9", a=value) is None
    assert ev("a NOT BETWEEN 1 AND 9", a=value) is None


@pytest.mark.parametrize(
    "expr",
    [
        "a = 1",
        "a <> 1",
        "a > 1",
        "a = 'x'",
        "a <> 'x'",
        "a = TRUE",
        "a BETWEEN 1 AND 2",
        "a NOT BETWEEN 1 AND 2",
        "a IN ('x')",
        "a NOT IN ('x')",
        "a CONTAINS 'x'",
        "a NOT CONTAINS 'x'",
        "a STARTSWITH 'x'",
        "a NOT STARTSWITH 'x'",
        "a ENDSWITH 'x'",
        "a NOT ENDSWITH 'x'",
        "a",
        "a = b",
    ],
)
def test_missing_property_is_unknown(expr: str) -> None:
    assert ev(expr, b="x") is None
    assert not match(expr, b="x")
    assert not match(f"NOT ({expr})", b="x")


# -- BETWEEN, IN, IS NULL, text matches --------------------------------------------------


@pytest.mark.parametrize(
    ("value", "inside"), [("1", True), ("5", True), ("10", True), ("0", False), ("10.5", False)]
)
def test_between_is_inclusive(value: str, inside: bool) -> None:
    assert ev("a BETWEEN 1 AND 10", a=value) is inside
    assert ev("a NOT BETWEEN 1 AND 10", a=value) is (not inside)


def test_between_with_property_bounds() -> None:
    assert ev("a BETWEEN lo AND hi", a="5", lo="1", hi="9") is True
    assert ev("a NOT BETWEEN lo AND hi", a="50", lo="1", hi="9") is True
    assert ev("a BETWEEN lo AND hi", a="5", lo="1") is None
    assert ev("a NOT BETWEEN lo AND 9", a="50") is True  # UNKNOWN OR TRUE


def test_between_and_binds_to_between() -> None:
    f = SqlFilter.compile("a BETWEEN 1 AND 5 AND b = 'x'")
    assert f.matches({"a": "3", "b": "x"})
    assert not f.matches({"a": "3", "b": "y"})


def test_in_list() -> None:
    assert ev("a IN ('x', 'y')", a="y") is True
    assert ev("a IN ('x', 'y')", a="z") is False
    assert ev("a NOT IN ('x', 'y')", a="z") is True
    assert ev("a NOT IN ('x','y')", a="x") is False
    assert ev("a IN ('1')", a="1.0") is False  # IN compares text


def test_is_null_is_never_unknown() -> None:
    assert ev("a IS NULL") is True
    assert ev("a IS NULL", a="") is False
    assert ev("a IS NOT NULL", a="") is True
    assert ev("a IS NOT NULL") is False
    assert ev("NULL IS NULL") is True
    assert ev("5 IS NOT NULL") is True


@pytest.mark.parametrize(
    ("op", "value", "needle", "expected"),
    [
        ("CONTAINS", "hello world", "o w", True),
        ("CONTAINS", "hello", "xyz", False),
        ("CONTAINS", "hello", "", True),
        ("STARTSWITH", "hello", "he", True),
        ("STARTSWITH", "hello", "lo", False),
        ("ENDSWITH", "hello", "lo", True),
        ("ENDSWITH", "hello", "He", False),
    ],
)
def test_text_matches(op: str, value: str, needle: str, expected: bool) -> None:
    assert ev(f"a {op} '{needle}'", a=value) is expected
    assert ev(f"a NOT {op} '{needle}'", a=value) is (not expected)


def test_keywords_are_case_insensitive() -> None:
    assert match("a between 1 and 3 or b is not null and not c in ('x')", a="9", b="1", c="y")
    assert match("a Contains 'b' AnD TRUE", a="abc")
    assert match("a startswith 'x'", a="xy")


def test_identifier_characters() -> None:
    assert match(
        "order.id = 7 AND $v = 'x' AND _p_1 = 'y'", **{"order.id": "7", "$v": "x", "_p_1": "y"}
    )


def test_comments_are_ignored() -> None:
    assert match("a = 1 -- trailing comment", a="1")
    assert match("/* lead */ a = /* mid\nline */ 1", a="1")


def test_bare_property_reads_true_or_false() -> None:
    assert ev("flag", flag="true") is True
    assert ev("flag", flag="False") is False
    assert ev("flag", flag="yes") is None
    assert ev("NOT flag", flag="false") is True


# -- logic ------------------------------------------------------------------------


T, F, U = True, False, None
LITERAL = {T: "TRUE", F: "FALSE", U: "NULL"}
AND_TABLE = {
    (T, T): T, (T, F): F, (T, U): U,
    (F, T): F, (F, F): F, (F, U): F,
    (U, T): U, (U, F): F, (U, U): U,
}  # fmt: skip
OR_TABLE = {
    (T, T): T, (T, F): T, (T, U): T,
    (F, T): T, (F, F): F, (F, U): U,
    (U, T): T, (U, F): U, (U, U): U,
}  # fmt: skip


@pytest.mark.parametrize(("pair", "expected"), AND_TABLE.items())
def test_and_truth_table(pair: tuple[bool | None, bool | None], expected: bool | None) -> None:
    a, b = pair
    assert ev(f"{LITERAL[a]} AND {LITERAL[b]}") is expected
    # The same with conditions over properties: x = 1 is TRUE, x = 2 FALSE, y = 1 UNKNOWN.
    cond = {T: "x = 1", F: "x = 2", U: "y = 1"}
    assert ev(f"{cond[a]} AND {cond[b]}", x="1") is expected


@pytest.mark.parametrize(("pair", "expected"), OR_TABLE.items())
def test_or_truth_table(pair: tuple[bool | None, bool | None], expected: bool | None) -> None:
    a, b = pair
    assert ev(f"{LITERAL[a]} OR {LITERAL[b]}") is expected
    cond = {T: "x = 1", F: "x = 2", U: "y = 1"}
    assert ev(f"{cond[a]} OR {cond[b]}", x="1") is expected


@pytest.mark.parametrize(("value", "expected"), [(T, F), (F, T), (U, U)])
def test_not_truth_table(value: bool | None, expected: bool | None) -> None:
    assert ev(f"NOT {LITERAL[value]}") is expected
    assert ev(f"NOT NOT {LITERAL[value]}") is value
    assert ev(f"NOT NOT NOT {LITERAL[value]}") is expected


def test_and_binds_tighter_than_or() -> None:
    assert ev("TRUE OR FALSE AND FALSE") is True
    assert ev("(TRUE OR FALSE) AND FALSE") is False


def test_not_binds_looser_than_comparison() -> None:
    assert ev("NOT a = 1", a="2") is True
    assert ev("NOT a > 1 AND b = 'x'", a="0", b="x") is True


def test_long_chains_do_not_recurse() -> None:
    expr = " AND ".join(f"p{i} = '{i}'" for i in range(3000))
    props = {f"p{i}": str(i) for i in range(3000)}
    assert SqlFilter.compile(expr).matches(props)
    expr = " OR ".join(f"p = '{i}'" for i in range(3000))
    assert SqlFilter.compile(expr).matches({"p": "2999"})


def test_nested_parentheses_up_to_the_limit() -> None:
    depth = MAX_DEPTH
    assert match("(" * depth + "a = 1" + ")" * depth, a="1")


# -- errors (every one asserts the position) ------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "position", "fragment"),
    [
        ("", 0, "empty expression"),
        ("   ", 3, "empty expression"),
        ("-- only a comment", 17, "empty expression"),
        ("a = 'abc", 4, "unterminated string"),
        ("a = 'it''s", 4, "unterminated string"),
        ("a = 1 /* open", 6, "unterminated comment"),
        ("a >", 3, "unexpected end of expression at position 3: expected a value"),
        ("a > 5 AND", 9, "expected a value"),
        ("a > 5 AND AND b = 1", 10, "unexpected token 'AND' at position 10: expected a value"),
        ("AND a = 1", 0, "expected a value"),
        ("a = 1 b = 2", 6, "expected AND, OR or end of expression"),
        ("a = 1)", 5, "no matching '('"),
        ("(a = 1", 6, "expected AND, OR or ')'"),
        ("a = 1 = 2", 6, "unexpected token '='"),
        ("a = ", 4, "expected a value"),
        ("a = -b", 5, "expected a number after '-'"),
        ("a == 1", 3, "expected a value"),
        ("a != 1", 2, "use '<>'"),
        ('"a" = 1', 0, "single quotes"),
        ("a = 1 # x", 6, "unexpected character '#'"),
        ("a > 5abc", 4, "malformed number '5abc'"),
        ("a > 1.2.3", 4, "malformed number"),
        ("a = NULL", 4, "use IS NULL"),
        ("NULL <> a", 0, "use IS NULL"),
        ("a > TRUE", 4, "only = and <> apply"),
        ("a BETWEEN NULL AND 3", 10, "NULL cannot be compared"),
        ("a BETWEEN 5 AND 1", 10, "empty range"),
        ("a BETWEEN 1 OR 5", 12, "expected AND between the bounds"),
        ("a BETWEEN 1", 11, "expected AND"),
        ("a IN 'x'", 5, "expected '(' after IN"),
        ("a IN ()", 6, "expected a string in the IN list"),
        ("a IN (1, 2)", 6, "expected a string in the IN list"),
        ("a IN ('x',)", 10, "expected a string after ','"),
        ("a IN ('x' 'y')", 10, "expected ',' or ')'"),
        ("a IN ('x'", 9, "expected ',' or ')'"),
        ("a CONTAINS 5", 11, "expected a string after CONTAINS"),
        ("a STARTSWITH b", 13, "expected a string after STARTSWITH"),
        ("a ENDSWITH", 10, "expected a string after ENDSWITH"),
        ("a NOT LIKE 'x'", 6, "expected BETWEEN, IN, CONTAINS"),
        ("a NOT", 5, "expected BETWEEN, IN"),
        ("a IS", 4, "expected NULL or NOT NULL"),
        ("a IS NOT 5", 9, "expected NULL after IS NOT"),
        ("a IS TRUE", 5, "expected NULL or NOT NULL"),
        ("5", 0, "is not a condition"),
        ("'x'", 0, "is not a condition"),
        ("a = 1 AND 7", 10, "is not a condition"),
        ("NOT 'x'", 4, "is not a condition"),
        ("-5 OR a", 0, "is not a condition"),
        ("(a = 1) = 2", 1, "used as the left side of '='"),
        ("a = (b > 1)", 5, "used as the right side of '='"),
        ("(a > 1) IN ('x')", 1, "used as the left side of IN"),
        ("NOT", 3, "expected a value"),
        ("a = NOT b", 4, "expected a value"),
        ("()", 1, "expected a value"),
        ("a IN", 4, "expected '(' after IN"),
    ],
)
def test_syntax_errors_report_position(expr: str, position: int, fragment: str) -> None:
    err = error(expr)
    assert err.position == position, err.message
    assert fragment in err.message


def test_error_message_format() -> None:
    err = error("a > 5 AND AND b = 1")
    assert err.message == "unexpected token 'AND' at position 10: expected a value"


def test_too_deep_nesting_is_an_error_not_a_crash() -> None:
    expr = "(" * 5000 + "a = 1" + ")" * 5000
    err = error(expr)
    assert err.position == MAX_DEPTH
    assert "nested too deeply" in err.message


def test_long_not_chain_is_fine() -> None:
    assert ev("NOT " * 5001 + "a = 1", a="1") is False


def test_non_string_expression_is_an_error() -> None:
    with pytest.raises(FilterExpressionError) as info:
        SqlFilter.compile(None)  # type: ignore[arg-type]
    assert info.value.position == 0


def test_huge_numbers_do_not_crash() -> None:
    digits = "9" * 5000
    assert ev(f"a < {digits}", a="1") is True
    assert ev("a > 1", a=digits) is True
    assert ev("a > 1e999", a="1") is False


# -- property tests ------------------------------------------------------------------


VOCABULARY = [
    "a", "b", "c.d", "$e", "NOT", "AND", "OR", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE",
    "CONTAINS", "STARTSWITH", "ENDSWITH", "=", "<>", "<", "<=", ">", ">=", "(", ")", ",", "-",
    "+", "1", "2.5", "-3", "1e2", "'x'", "''", "'it''s'", "'", "/*", "*/", "--", "!", "10L",
]  # fmt: skip
values = st.one_of(
    st.integers(-1000, 1000).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    st.sampled_from(["x", "", "true", "FALSE", "abc", "1e3", "-0"]),
)
props = st.dictionaries(st.sampled_from(["a", "b", "c.d", "$e", "TAGS"]), values, max_size=4)


def check_compiles_or_fails_cleanly(expr: str, properties: dict[str, str]) -> None:
    try:
        f = SqlFilter.compile(expr)
    except FilterExpressionError as e:
        assert 0 <= e.position <= len(expr)
        assert f"at position {e.position}" in e.message
    else:
        assert f.evaluate(properties) in (True, False, None)
        assert f.matches(properties) is (f.evaluate(properties) is True)


@given(st.text(max_size=60), props)
def test_random_text_raises_only_filter_errors(expr: str, properties: dict[str, str]) -> None:
    check_compiles_or_fails_cleanly(expr, properties)


@given(st.lists(st.sampled_from(VOCABULARY), max_size=14), props)
def test_random_token_soup_raises_only_filter_errors(
    words: list[str], properties: dict[str, str]
) -> None:
    check_compiles_or_fails_cleanly(" ".join(words), properties)


# Predicates over property x that are never IS [NOT] NULL.
numbers = st.integers(-50, 50).map(str)
comparisons = st.one_of(
    st.builds(
        lambda op, lit: f"x {op} {lit}",
        st.sampled_from(["=", "<>", "<", "<=", ">", ">="]),
        st.one_of(numbers, st.sampled_from(["'x'", "''", "1.5", "'10'", "y"])),
    ),
    st.builds(
        lambda op, lit: f"x {op} {lit}",
        st.sampled_from(["=", "<>"]),
        st.sampled_from(["TRUE", "FALSE"]),
    ),
)
others = st.one_of(
    st.builds(lambda n, lo: f"x {n}BETWEEN {lo} AND {lo}", st.sampled_from(["", "NOT "]), numbers),
    st.builds(lambda n: f"x {n}IN ('a', 'b')", st.sampled_from(["", "NOT "])),
    st.builds(
        lambda n, k: f"x {n}{k} 'a'",
        st.sampled_from(["", "NOT "]),
        st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]),
    ),
    st.just("x"),
)
predicates_on_x = st.one_of(comparisons, others)


@given(predicates_on_x, props)
def test_predicate_and_its_negation_never_match_a_missing_property(
    predicate: str, properties: dict[str, str]
) -> None:
    properties.pop("x", None)
    assert not match(predicate, **properties)
    assert not match(f"NOT ({predicate})", **properties)
    assert not match(f"NOT {predicate}", **properties)


@given(predicates_on_x, values)
def test_not_is_the_complement_when_known(predicate: str, value: str) -> None:
    result = ev(predicate, x=value)
    negated = ev(f"NOT ({predicate})", x=value)
    assert negated is (None if result is None else not result)


@given(predicates_on_x, predicates_on_x, props, values)
def test_de_morgan(p: str, q: str, properties: dict[str, str], value: str) -> None:
    properties["x"] = value
    assert ev(f"NOT (({p}) AND ({q}))", **properties) is ev(f"NOT ({p}) OR NOT ({q})", **properties)
    assert ev(f"NOT (({p}) OR ({q}))", **properties) is ev(f"NOT ({p}) AND NOT ({q})", **properties)


@given(st.integers(), st.integers())
def test_integer_comparisons_agree_with_python(a: int, b: int) -> None:
    for op, fn in [
        ("=", a.__eq__), ("<>", a.__ne__), ("<", a.__lt__),
        ("<=", a.__le__), (">", a.__gt__), (">=", a.__ge__),
    ]:  # fmt: skip
        assert ev(f"x {op} {b}", x=str(a)) is fn(b)


@given(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(10**6), 10**6))
def test_float_property_against_integer_literal(a: float, b: int) -> None:
    assert ev(f"x < {b}", x=repr(a)) is (a < b)


@given(st.text(max_size=20))
def test_any_string_literal_round_trips(s: str) -> None:
    quoted = "'" + s.replace("'", "''") + "'"
    assert match(f"a = {quoted}", a=s)
    assert not match(f"a <> {quoted}", a=s)
    assert match(f"a IN ({quoted}, 'other')", a=s)


# -- speed (a sanity print, not an assertion) -----------------------------------------


def test_evaluation_speed_sanity(capsys: pytest.CaptureFixture[str]) -> None:
    cases = {
        "a > 5 AND b = 'x'": {"a": "6", "b": "x"},
        "a BETWEEN 1 AND 10 OR c IN ('p', 'q', 'r')": {"a": "60", "c": "q"},
        "NOT (s STARTSWITH 'pre' AND t IS NOT NULL)": {"s": "prefix"},
    }
    lines = []
    for expr, properties in cases.items():
        f = SqlFilter.compile(expr)
        n = 20_000
        start = time.perf_counter()
        for _ in range(n):
            f.matches(properties)
        per_call = (time.perf_counter() - start) / n
        lines.append(f"{per_call * 1e6:6.2f} us  {expr}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
