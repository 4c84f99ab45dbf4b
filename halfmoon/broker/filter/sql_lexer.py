"""Tokens of the SQL92 filter language.

Whitespace separates tokens; ``-- comment`` runs to the end of the line and
``/* comment */`` may span lines (both as in RocketMQ's grammar). Tokens:

* keywords, case-insensitive: ``AND OR NOT BETWEEN IN IS NULL TRUE FALSE
  CONTAINS STARTSWITH ENDSWITH``;
* identifiers (property names): a letter, ``_`` or ``$``, then letters,
  digits, ``_``, ``.`` or ``$``. A word that spells a keyword is the keyword;
* numbers: ``12``, ``12L``, ``1.5``, ``1.``, ``.5``, ``1e3``, ``1.5E-3``
  (a sign is a separate token, folded by the parser);
* strings: ``'it''s'`` (a doubled quote is a quote);
* operators: ``= <> < <= > >= ( ) , + -``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from halfmoon.broker.filter.errors import FilterExpressionError

KEYWORDS: Final = frozenset(
    {
        "AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE",
        "CONTAINS", "STARTSWITH", "ENDSWITH",
    }
)  # fmt: skip

# Token kinds.
KEYWORD: Final = "keyword"
IDENT: Final = "identifier"
NUMBER: Final = "number"
STRING: Final = "string"
OP: Final = "operator"
EOF: Final = "end"

_TOKEN = re.compile(
    r"""
      (?P<space>\s+)
    | (?P<comment>--[^\r\n]*|/\*.*?\*/)
    | (?P<number>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
    | (?P<string>'(?:[^']|'')*+')
    | (?P<word>(?:[^\W\d]|\$)[\w.$]*)
    | (?P<op><>|<=|>=|[=<>(),+-])
    """,
    re.VERBOSE | re.DOTALL,
)
_INTEGER = re.compile(r"[0-9]+")
_WORD_CHAR = re.compile(r"[\w.$]")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    #: Keyword in upper case, identifier name, operator text, decoded string,
    #: or the number's int/float value.
    value: object
    position: int
    #: The token as written in the expression.
    text: str

    def describe(self) -> str:
        if self.kind == EOF:
            return "end of expression"
        text = self.text if len(self.text) <= 30 else self.text[:27] + "..."
        return f"'{text}'" if self.kind != STRING else text


def parse_number(text: str) -> int | float:
    """The value of a numeric literal (digits only: an int; else a float)."""
    if _INTEGER.fullmatch(text):
        try:
            return int(text)
        except ValueError:  # more digits than int() accepts from a string
            return float(text)
    return float(text)


def _error(expression: str, message: str, position: int) -> FilterExpressionError:
    return FilterExpressionError(message, position=position, expression=expression)


def tokenize(expression: str) -> list[Token]:
    """Split ``expression`` into tokens, ending with an EOF token."""
    tokens: list[Token] = []
    pos = 0
    end = len(expression)
    match = _TOKEN.match
    while pos < end:
        m = match(expression, pos)
        if m is None:
            raise _unexpected_character(expression, pos)
        kind = m.lastgroup
        text = m.group()
        nxt = m.end()
        if kind == "number":
            if nxt < end and expression[nxt] in "lL" and _INTEGER.fullmatch(text):
                nxt += 1  # Java-style long suffix, as RocketMQ accepts: 10L
            if nxt < end and _WORD_CHAR.match(expression, nxt):
                stop = nxt
                while stop < end and _WORD_CHAR.match(expression, stop):
                    stop += 1
                raise _error(
                    expression,
                    f"malformed number '{expression[pos:stop]}' at position {pos}: "
                    "expected digits with an optional fraction and exponent, like 12, 1.5 or 2e3",
                    pos,
                )
            tokens.append(Token(NUMBER, parse_number(text), pos, expression[pos:nxt]))
        elif kind == "string":
            tokens.append(Token(STRING, text[1:-1].replace("''", "'"), pos, text))
        elif kind == "word":
            upper = text.upper()
            if upper in KEYWORDS:
                tokens.append(Token(KEYWORD, upper, pos, text))
            else:
                tokens.append(Token(IDENT, text, pos, text))
        elif kind == "op":
            tokens.append(Token(OP, text, pos, text))
        # space and comments produce no token
        pos = nxt
    tokens.append(Token(EOF, None, end, ""))
    return tokens


def _unexpected_character(expression: str, pos: int) -> FilterExpressionError:
    char = expression[pos]
    if char == "'":
        return _error(
            expression,
            f"unterminated string starting at position {pos}: expected a closing quote "
            "(write '' for a quote inside a string)",
            pos,
        )
    if expression.startswith("/*", pos):
        return _error(
            expression,
            f"unterminated comment starting at position {pos}: expected '*/'",
            pos,
        )
    if expression.startswith("!=", pos):
        return _error(
            expression, f"unexpected operator '!=' at position {pos}: use '<>' for 'not equal'", pos
        )
    if char == '"':
        return _error(
            expression,
            f"unexpected character '\"' at position {pos}: strings use single quotes, "
            "property names are written without quotes",
            pos,
        )
    shown = char if char.isprintable() else repr(char)[1:-1]
    return _error(
        expression,
        f"unexpected character '{shown}' at position {pos}: expected a property name, "
        "a literal, an operator or a parenthesis",
        pos,
    )
