"""``halfmoon status``: the numbers an operator looks at first."""

from __future__ import annotations

import argparse

from halfmoon.cli.cluster_commands import add_broker_option, for_broker
from halfmoon.cli.parser import add_command, client, emit
from halfmoon.cli.table import render_record


def register(commands: argparse._SubParsersAction) -> None:
    status = add_command(commands, "status", show_status, "show the broker's status")
    add_broker_option(status)


def show_status(args: argparse.Namespace) -> None:
    status = client(args).get(for_broker("/v1/status", args))
    emit(args, status, lambda: render_record(status))
