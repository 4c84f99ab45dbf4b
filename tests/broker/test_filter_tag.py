"""Tag filters, the tag hash and compile_filter's dispatch."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from halfmoon.broker.filter import (
    FilterExpressionError,
    SqlFilter,
    TagFilter,
    compile_filter,
    tag_hash,
)
from halfmoon.errors import InvalidArgument

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# A tag never contains "||" and has no surrounding whitespace.
tags = (
    st.text(min_size=1, max_size=12)
    .map(str.strip)
    .filter(
        lambda t: t and "||" not in t and t != "*" and not t.startswith("|") and not t.endswith("|")
    )
)


# -- match-all -------------------------------------------------------------------


@pytest.mark.parametrize("expr", ["*", "", "   ", " * ", "\t*\n"])
def test_star_and_empty_match_everything(expr: str) -> None:
    f = TagFilter.parse(expr)
    assert f.hash_codes is None
    assert f.tags is None
    assert f.matches("TagA")
    assert f.matches("")


def test_only_match_all_accepts_a_message_without_tag() -> None:
    assert TagFilter.parse("*").matches(None)
    assert not TagFilter.parse("TagA").matches(None)
    assert not TagFilter.parse("TagA || TagB").matches(None)


def test_star_among_alternatives_means_match_all() -> None:
    f = TagFilter.parse("TagA || *")
    assert f.hash_codes is None
    assert f.matches(None)


# -- tag lists -------------------------------------------------------------------


def test_single_tag() -> None:
    f = TagFilter.parse("TagA")
    assert f.matches("TagA")
    assert not f.matches("TagB")
    assert f.hash_codes == frozenset({tag_hash("TagA")})


def test_alternatives_with_and_without_spaces() -> None:
    for expr in ("A||B||C", "A || B || C", "  A ||B||   C  "):
        f = TagFilter.parse(expr)
        assert f.tags == frozenset({"A", "B", "C"})
        assert all(f.matches(t) for t in "ABC")
        assert not f.matches("D")


def test_tags_are_case_sensitive() -> None:
    f = TagFilter.parse("TagA")
    assert not f.matches("taga")
    assert not f.matches("TAGA")


def test_inner_whitespace_is_part_of_the_tag() -> None:
    f = TagFilter.parse("tag a || b")
    assert f.matches("tag a")
    assert not f.matches("taga")


def test_empty_alternatives_are_skipped_like_rocketmq() -> None:
    assert TagFilter.parse("A || || B").tags == frozenset({"A", "B"})
    assert TagFilter.parse("A ||").tags == frozenset({"A"})
    assert TagFilter.parse("|| A").tags == frozenset({"A"})


def test_duplicate_tags_collapse() -> None:
    f = TagFilter.parse("A || A")
    assert f.tags == frozenset({"A"})
    assert len(f.hash_codes or ()) == 1


@pytest.mark.parametrize(("expr", "position"), [("||", 0), ("  ||  ", 2), ("|| || ||", 0)])
def test_expression_naming_no_tag_is_an_error(expr: str, position: int) -> None:
    with pytest.raises(FilterExpressionError) as info:
        TagFilter.parse(expr)
    assert info.value.position == position
    assert info.value.code == "ILLEGAL_FILTER_EXPRESSION"
    assert f"at position {position}" in info.value.message


def test_non_string_expression_is_an_error() -> None:
    with pytest.raises(FilterExpressionError) as info:
        TagFilter.parse(None)  # type: ignore[arg-type]
    assert info.value.position == 0


def test_filter_error_is_an_invalid_argument() -> None:
    assert issubclass(FilterExpressionError, InvalidArgument)


def test_equal_filters_compare_equal() -> None:
    assert TagFilter.parse("A || B") == TagFilter.parse("B||A")
    assert hash(TagFilter.parse("A || B")) == hash(TagFilter.parse("B||A"))
    assert TagFilter.parse("*") == TagFilter.parse("")


# -- tag hash --------------------------------------------------------------------


def test_tag_hash_is_pinned() -> None:
    # The hash is part of the on-disk consume-queue format: these must never change.
    assert tag_hash("TagA") == 5042894231036011105
    assert tag_hash("") == 0  # no tag
    assert tag_hash("订单") == 8047084877056969971


def test_tag_hash_is_signed_big_endian_blake2b() -> None:
    digest = hashlib.blake2b(b"TagA", digest_size=8).digest()
    assert tag_hash("TagA") == int.from_bytes(digest, "big", signed=True)


def test_tag_hash_differs_for_different_tags() -> None:
    assert tag_hash("TagA") != tag_hash("TagB")
    assert tag_hash("a") != tag_hash("A")


def test_tag_hash_accepts_lone_surrogates() -> None:
    assert INT64_MIN <= tag_hash("\ud800") <= INT64_MAX


@given(st.text())
def test_tag_hash_fits_signed_int64(tag: str) -> None:
    value = tag_hash(tag)
    assert INT64_MIN <= value <= INT64_MAX
    assert value == tag_hash(tag)


# -- properties ------------------------------------------------------------------


@given(st.lists(tags, min_size=1, max_size=6), st.sampled_from(["||", " || ", "||  "]))
def test_parse_accepts_exactly_the_listed_tags(listed: list[str], sep: str) -> None:
    f = TagFilter.parse(sep.join(listed))
    assert f.tags == frozenset(listed)
    assert f.hash_codes == frozenset(tag_hash(t) for t in listed)
    for t in listed:
        assert f.matches(t)
        assert tag_hash(t) in (f.hash_codes or ())


@given(st.lists(tags, min_size=1, max_size=4), tags)
def test_unlisted_tag_does_not_match(listed: list[str], other: str) -> None:
    f = TagFilter.parse(" || ".join(listed))
    assert f.matches(other) == (other in listed)


@given(st.text())
def test_parse_raises_only_filter_errors(expr: str) -> None:
    try:
        f = TagFilter.parse(expr)
    except FilterExpressionError as e:
        assert 0 <= e.position <= len(expr)
    else:
        assert f.hash_codes is None or len(f.hash_codes) >= 1


# -- compile_filter ----------------------------------------------------------------


def test_compile_filter_tag() -> None:
    f = compile_filter("TAG", "A || B")
    assert f.tag_hash_codes == frozenset({tag_hash("A"), tag_hash("B")})
    assert f.matches_message("A", {})
    assert not f.matches_message("C", {"A": "1"})
    assert not f.matches_message(None, {})


def test_compile_filter_tag_match_all_has_no_hash_codes() -> None:
    f = compile_filter("TAG", "*")
    assert f.tag_hash_codes is None
    assert f.matches_message(None, {})


def test_compile_filter_empty_kind_means_tag() -> None:
    assert isinstance(compile_filter("", "A"), TagFilter)


def test_compile_filter_sql92() -> None:
    f = compile_filter("SQL92", "a > 5")
    assert isinstance(f, SqlFilter)
    assert f.tag_hash_codes is None
    assert f.matches_message("any", {"a": "6"})
    assert not f.matches_message(None, {"a": "5"})


def test_compile_filter_kind_is_case_insensitive() -> None:
    assert isinstance(compile_filter("sql92", "a = 1"), SqlFilter)
    assert isinstance(compile_filter("tag", "*"), TagFilter)


def test_compile_filter_unknown_kind() -> None:
    with pytest.raises(InvalidArgument, match="unknown filter type 'XPATH'"):
        compile_filter("XPATH", "a")


def test_compile_filter_sql_error_carries_position() -> None:
    with pytest.raises(FilterExpressionError) as info:
        compile_filter("SQL92", "a = ")
    assert info.value.position == 4


def test_compile_filter_sql_sees_tag_as_tags_property() -> None:
    f = compile_filter("SQL92", "TAGS IN ('TagA', 'TagB') AND a IS NOT NULL")
    assert f.matches_message("TagA", {"a": "1"})
    assert not f.matches_message("TagC", {"a": "1"})
    assert not f.matches_message(None, {"a": "1"})
