"""``halfmoon status``: the numbers an operator looks at first."""

from __future__ import annotations

import argparse

from halfmoon.cli.parser import add_command, client, emit
from halfmoon.cli.table import render_record


def register(commands: argparse._SubParsersAction) -> None:
    add_command(commands, "status", show_status, "show the broker's status")


def show_status(args: argparse.Namespace) -> None:
    status = client(args).get("/v1/status")
    emit(args, status, lambda: render_record(status))
