"""``halfmoon status``: the numbers an operator looks at first.

What the dashboard's Overview shows (``GET /v1/broker/status``, as ``cluster
status``): traffic, pending and parked transactions, connected clients and
producers, disk used and free, topics, groups and their configured queues.

``--wait 30s`` waits for a server that is still starting (a script's
``halfmoon serve &`` followed by the first command): it asks again every
100 ms until the admin API answers or the time is up, then prints the status
as usual. Only an unreachable server is waited for; any answer, an error
included, ends the wait.
"""

from __future__ import annotations

import argparse
import time

from halfmoon.cli.admin_client import CliError
from halfmoon.cli.cluster_commands import add_broker_option, for_broker, render_broker_status
from halfmoon.cli.parser import add_command, client, emit
from halfmoon.cli.timearg import duration

_RETRY_EVERY_S = 0.1


def register(commands: argparse._SubParsersAction) -> None:
    status = add_command(commands, "status", show_status, "show the broker's status")
    add_broker_option(status)
    status.add_argument(
        "--wait",
        type=duration,
        default=None,
        metavar="DURATION",
        help="wait up to DURATION (30s, 2m) for a server that is still starting",
    )


def show_status(args: argparse.Namespace) -> None:
    admin = client(args)
    path = for_broker("/v1/broker/status", args)
    deadline = None if args.wait is None else time.monotonic() + args.wait
    while True:
        try:
            status = admin.get(path)
            break
        except CliError as exc:
            if exc.code != "UNAVAILABLE" or deadline is None or time.monotonic() >= deadline:
                if deadline is not None and exc.code == "UNAVAILABLE":
                    raise CliError(
                        f"no server answered within {args.wait:g} s: {exc.message}", exc.code
                    ) from None
                raise
            time.sleep(_RETRY_EVERY_S)
    emit(args, status, lambda: render_broker_status(status))
