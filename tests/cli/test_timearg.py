"""Times and durations on the command line read as configuration keys read theirs."""

from __future__ import annotations

import argparse

import pytest

from halfmoon.cli.main import build_parser
from halfmoon.cli.parser import leaf_commands
from halfmoon.cli.timearg import duration, parse_time_ms
from halfmoon.config import parse_duration_ms


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("2s", 2), ("1.5", 1.5), ("5m", 300), ("2h", 7200), ("1d", 86400)],
)
def test_a_duration_flag_reads_the_configurations_units(text: str, seconds: float) -> None:
    assert duration(text) == seconds == parse_duration_ms(text, bare_unit_ms=1000) / 1000


@pytest.mark.parametrize("text", ["0", "0s", "soon", "5y", "-1s"])
def test_a_duration_flag_refuses_what_is_no_positive_duration(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="duration"):
        duration(text)


def test_a_time_ago_reads_the_same_units() -> None:
    now = 100 * 86_400_000
    assert parse_time_ms("1d", now) == parse_time_ms("-24h", now) == now - 86_400_000
    assert parse_time_ms("1500ms", now) == parse_time_ms("1.5s", now) == now - 1500


def test_no_flag_takes_a_bare_float() -> None:
    """A duration flag takes ``duration`` (500ms, 2s) or goes to a configuration key, which
    reads the same forms; a float flag would take neither."""
    floats = [
        (" ".join(words), action.option_strings)
        for words, command in leaf_commands(build_parser())
        for action in command._actions
        if action.type is float
    ]
    assert floats == []
