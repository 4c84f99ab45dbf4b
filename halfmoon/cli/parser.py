"""argparse, made to report a bad command line as one line instead of a usage dump."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from halfmoon.cli.admin_client import AdminClient, CliError, default_admin_url, default_namespace
from halfmoon.errors import EXIT_USAGE


class UsageError(CliError):
    """The command line itself is wrong (exit status 2)."""

    def __init__(self, message: str, code: str | None = None, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message, code, exit_code)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')", "USAGE")


def new_parser(prog: str, **kwargs: Any) -> argparse.ArgumentParser:
    return _Parser(prog=prog, **kwargs)


def admin_options() -> argparse.ArgumentParser:
    """The options every admin command takes, as a parent parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--admin",
        metavar="URL",
        default=None,
        help="admin API address, http://HOST:PORT (default: $HALFMOON_ADMIN or http://127.0.0.1:8082)",
    )
    common.add_argument(
        "--namespace",
        metavar="NS",
        default=None,
        help="take topic and group names in namespace NS (stored as NS%%name, as RocketMQ "
        "does); lists show only NS's (default: $HALFMOON_NAMESPACE, else none)",
    )
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    return common


def add_command(
    subparsers: argparse._SubParsersAction,
    name: str,
    handler: Callable[[argparse.Namespace], int | None],
    help: str,
    admin: bool = True,
) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        name,
        help=help,
        description=help,
        parents=[admin_options()] if admin else [],
    )
    parser.set_defaults(handler=handler)
    return parser


def client(args: argparse.Namespace) -> AdminClient:
    namespace = getattr(args, "namespace", None)
    if namespace is None:
        namespace = default_namespace()
    return AdminClient(args.admin or default_admin_url(), namespace=namespace)


def emit(args: argparse.Namespace, data: Any, human: Callable[[], str]) -> None:
    """Print ``data`` as JSON under ``--json``, else the text ``human()`` renders."""
    if args.json:
        json.dump(data, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
    else:
        text = human()
        if text:
            print(text)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value
