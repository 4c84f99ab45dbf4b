"""One default and one shape everywhere: the CLI agrees with the Python API and the admin API."""

from __future__ import annotations

import argparse
import inspect

import pytest

from halfmoon.cli.main import build_parser
from halfmoon.cli.parser import emit, leaf_commands
from halfmoon.outbox.relay import DEFAULT_BATCH_SIZE, DEFAULT_WORKERS, Relay


def _command(*words: str):  # type: ignore[no-untyped-def]
    return dict(leaf_commands(build_parser()))[words]


def test_relay_cli_defaults_are_the_python_relays() -> None:
    parameters = inspect.signature(Relay).parameters
    cli = _command("outbox", "relay")
    defaults = {a.dest: a.default for a in cli._actions}
    assert parameters["workers"].default == DEFAULT_WORKERS == defaults["workers"]
    assert parameters["batch_size"].default == DEFAULT_BATCH_SIZE == defaults["batch"]
    assert parameters["poll_interval"].default == defaults["poll"]
    assert parameters["max_attempts"].default == defaults["max_attempts"]
    # The help a user reads says the same numbers.
    helps = {a.dest: a.help or "" for a in cli._actions}
    assert f"(default {DEFAULT_WORKERS})" in helps["workers"]
    assert f"(default {DEFAULT_BATCH_SIZE})" in helps["batch"]


def test_json_output_is_an_object_never_a_bare_list() -> None:
    # Listings print the admin API's object ({"transactions": [...]}), so a script
    # reads one shape from the CLI and the API; emit refuses anything else.
    with pytest.raises(TypeError, match="object"):
        emit(argparse.Namespace(json=True), [{"transaction_id": "x"}], lambda: "")
