"""``halfmoon``: the command line. A thin shell: parse, call, print.

Admin commands talk to a running broker's admin HTTP API (``--admin URL``,
default ``$HALFMOON_ADMIN`` or http://127.0.0.1:8082) and print tables for
people or JSON with ``--json``. Any error exits non-zero with one line on
stderr: ``halfmoon: error: <what went wrong> (<CODE>)``, or under ``--json`` (which may
stand anywhere on the line) the admin API's error object on that one line,
``{"error": {"code": CODE, "message": TEXT}}``. Exit codes: 0 ok,
1 the operation failed, 2 the command line was wrong, 3 (``serve``, ``broker``)
another live process holds the data directory.

A :class:`~halfmoon.errors.HalfmoonError` exits with its class's ``exit_code``
(the same table gives the admin API its HTTP status and the gRPC endpoint its
protocol Code).

Each command family lives in its own module with a ``register`` function, so
the command line grows by adding modules; only ``serve`` imports the broker.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import time
from collections.abc import Sequence

from halfmoon import environment
from halfmoon.cli import (
    auth_commands,
    broker_command,
    cluster_commands,
    completion_command,
    consumer_commands,
    definitions_commands,
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
from halfmoon.cli.parser import UsageError, new_parser
from halfmoon.errors import HalfmoonError

EXIT_OK = 0


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(
        "halfmoon",
        description="halfmoon: a transactional message broker speaking the RocketMQ 5 protocol.",
    )
    parser.add_argument("--version", action="version", version=f"halfmoon {_version()}")
    # Not required: a bare `halfmoon` prints this help, as kubectl and docker do.
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
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
    definitions_commands.register(commands)
    completion_command.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    wants_json = _take_json_flag(words)
    args: argparse.Namespace | None = None
    try:
        args = parser.parse_args(words)
        if args.command is None:
            parser.print_help()
            return EXIT_OK
        if wants_json:
            if not hasattr(args, "json"):
                raise UsageError(f"'halfmoon {args.command}' has no --json output", "USAGE")
            args.json = True
        return int(args.handler(args) or EXIT_OK)
    except (CliError, HalfmoonError) as exc:  # UsageError included: it exits with 2
        error = exc if isinstance(exc, CliError) else CliError.of(exc)
        if wants_json:
            _fail_json(error)
        elif _logs_json(args):
            _fail_log_json(error)
        else:
            _fail(error.line())
        return error.exit_code
    except KeyboardInterrupt:
        _fail("interrupted")
        return 130
    except BrokenPipeError:
        # `halfmoon topic list | head`: the reader left; not an error worth a line.
        return EXIT_OK


def _take_json_flag(words: list[str]) -> bool:
    """Remove every ``--json`` before a ``--`` from ``words``; True if there was one.

    ``--json`` belongs to the whole command line, not to one subcommand's parser, so
    ``halfmoon --json topic list`` and ``halfmoon topic list --json`` are the same, and
    an error is reported as JSON even when the command line itself is wrong."""
    end = words.index("--") if "--" in words else len(words)
    found = "--json" in words[:end]
    words[:end] = [word for word in words[:end] if word != "--json"]
    return found


def _fail_json(error: CliError) -> None:
    # The admin API's error shape, on one line, still on stderr: stdout holds only results.
    body = {"error": {"code": error.code or "FAILED", "message": " ".join(error.message.split())}}
    print(json.dumps(body), file=sys.stderr)


def _logs_json(args: argparse.Namespace | None) -> bool:
    """Whether a server command (serve, broker, proxy) writes its log as JSON, by its flag
    or HALFMOON_LOG_FORMAT: then its last line, the reason it could not start, is JSON too."""
    if args is None or not hasattr(args, "log_format"):
        return False
    chosen = args.log_format or environment.variables().get(
        environment.key_variable("log.format"), ""
    )
    return chosen.strip().lower() == "json"


def _fail_log_json(error: CliError) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    line = {
        "time": f"{stamp}Z",
        "level": "ERROR",
        "logger": "halfmoon.cli",
        "event": "start_failed",
        "code": error.code or "FAILED",
        "message": " ".join(error.message.split()),
    }
    print(json.dumps(line), file=sys.stderr)


def _version() -> str:
    try:
        return importlib.metadata.version("halfmoon")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout without installing
        return "unknown (not installed)"


def _fail(line: str) -> None:
    # One line, always: collapse anything multi-line a message may carry.
    print(f"halfmoon: error: {' '.join(line.split())}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
