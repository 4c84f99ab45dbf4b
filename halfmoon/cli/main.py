"""``halfmoon``: the command line. A thin shell: parse, call, print.

Admin commands talk to a running broker's admin HTTP API (``--admin URL``,
default ``$HALFMOON_ADMIN`` or http://127.0.0.1:8082) and print tables for
people or JSON with ``--json``. Any error exits non-zero with one line on
stderr: ``halfmoon: error: <what went wrong> (<CODE>)``. Exit codes: 0 ok,
1 the operation failed, 2 the command line was wrong.

A :class:`~halfmoon.errors.HalfmoonError` exits with its class's ``exit_code``
(the same table gives the admin API its HTTP status and the gRPC endpoint its
protocol Code).

Each command family lives in its own module with a ``register`` function, so
the command line grows by adding modules; only ``serve`` imports the broker.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from halfmoon.cli import (
    auth_commands,
    broker_command,
    cluster_commands,
    consumer_commands,
    group_commands,
    message_commands,
    monitor_command,
    outbox_commands,
    probe_commands,
    producer_commands,
    proxy_command,
    serve_command,
    spark_commands,
    stats_commands,
    status_command,
    topic_commands,
    transaction_commands,
)
from halfmoon.cli.admin_client import CliError
from halfmoon.cli.parser import new_parser
from halfmoon.errors import HalfmoonError

EXIT_OK = 0


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(
        "halfmoon",
        description="halfmoon: a transactional message broker speaking the RocketMQ 5 protocol.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve_command.register(commands)
    broker_command.register(commands)
    proxy_command.register(commands)
    topic_commands.register(commands)
    group_commands.register(commands)
    transaction_commands.register(commands)
    status_command.register(commands)
    spark_commands.register(commands)
    outbox_commands.register(commands)
    message_commands.register(commands)
    consumer_commands.register(commands)
    producer_commands.register(commands)
    cluster_commands.register(commands)
    stats_commands.register(commands)
    monitor_command.register(commands)
    probe_commands.register(commands)
    auth_commands.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.handler(args) or EXIT_OK)
    except (CliError, HalfmoonError) as exc:  # UsageError included: it exits with 2
        error = exc if isinstance(exc, CliError) else CliError.of(exc)
        _fail(error.line())
        return error.exit_code
    except KeyboardInterrupt:
        _fail("interrupted")
        return 130
    except BrokenPipeError:
        # `halfmoon topic list | head`: the reader left; not an error worth a line.
        return EXIT_OK


def _fail(line: str) -> None:
    # One line, always: collapse anything multi-line a message may carry.
    print(f"halfmoon: error: {' '.join(line.split())}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
