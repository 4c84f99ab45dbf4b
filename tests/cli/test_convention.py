"""Every command names things one way (halfmoon/cli/parser.py's docstring).

The subject a command acts on is its one positional argument; anything else is
an option. The walk covers the whole argparse tree, so a new command that
takes its topic as ``--topic`` (or a second positional) fails here.
"""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from halfmoon.cli.main import build_parser, main
from halfmoon.cli.parser import leaf_commands

# What a positional may be: the subject's kinds, by metavar (FILE: a document a command
# writes or reads whole, as `definitions export FILE`, rabbitmqctl's export_definitions PATH).
SUBJECT_METAVARS = {
    "NAME", "TOPIC", "GROUP", "ID", "KEY", "KEY=VALUE", "ACCESS_KEY", "SUBJECT", "FILE",
}  # fmt: skip
# Option names that carry a broker object; required, they would be a subject
# spelled as a flag, unless a positional subject already comes first.
OBJECT_OPTIONS = {"--topic", "--group", "--name", "--id", "--message-id", "--transaction"}

COMMANDS = list(leaf_commands(build_parser()))


def _positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not a.option_strings]


def test_the_walk_finds_every_family() -> None:
    families = {path[0] for path, _ in COMMANDS}
    assert {"serve", "topic", "group", "message", "spark", "outbox", "stats", "probe"} <= families
    assert len(COMMANDS) > 30


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=[" ".join(path) for path, _ in COMMANDS])
def test_command_follows_the_naming_convention(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    positionals = _positionals(parser)
    assert len(positionals) <= 1, f"{' '.join(path)}: more than one positional argument"
    for action in positionals:
        assert action.metavar in SUBJECT_METAVARS, (
            f"{' '.join(path)}: positional {action.metavar or action.dest!r} is not a subject"
        )
    if not positionals:
        for action in parser._actions:
            names = set(action.option_strings) & OBJECT_OPTIONS
            assert not (action.required and names), (
                f"{' '.join(path)}: the subject is spelled {sorted(names)[0]};"
                " make it the positional argument"
            )

    # The help a user reads shows the same: the subject in the usage line.
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main([*path, "--help"])
    assert exit_.value.code == 0
    usage = out.getvalue().split("\n\n")[0]
    for action in positionals:
        assert action.metavar in usage


@pytest.mark.parametrize(
    "argv",
    [
        ["message", "send", "--topic", "orders", "--body", "hi"],
        ["message", "send", "--body", "hi", "--topic=orders"],
        ["probe", "send", "--topic", "orders"],
        ["spark", "stats", "--topic", "orders", "--topic", "payments"],
    ],
    ids=["space", "equals", "probe", "repeated"],
)
def test_shipped_flag_spelling_still_parses_with_one_warning(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = build_parser().parse_args(argv)
    expected = ["orders", "payments"] if argv[0] == "spark" else "orders"
    assert args.topic == expected
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "deprecated" in err, err
    assert f"halfmoon {argv[0]} {argv[1]} TOPIC" in err


def test_positional_subject_parses_without_warning(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["message", "send", "orders", "--body", "hi"])
    assert args.topic == "orders"
    assert capsys.readouterr().err == ""


def test_a_flag_that_is_not_the_deprecated_one_is_left_alone() -> None:
    # consumer reset-offset's --topic qualifies its subject (the group); it stays a flag.
    args = build_parser().parse_args(
        ["consumer", "reset-offset", "billing", "--topic", "orders", "--time", "now"]
    )
    assert (args.group, args.topic) == ("billing", "orders")


def test_cluster_failover_takes_its_group_as_a_flag_too(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["cluster", "failover", "--group", "g1", "--to", "b2"])
    assert (args.group, args.to) == ("g1", "b2")
    assert "write 'halfmoon cluster failover GROUP'" in capsys.readouterr().err
    args = build_parser().parse_args(["cluster", "failover", "g1"])
    assert (args.group, args.to) == ("g1", None)
    assert capsys.readouterr().err == ""
