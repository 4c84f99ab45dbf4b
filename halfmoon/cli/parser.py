"""argparse, made to report a bad command line as one line instead of a usage dump.

**One naming convention for every command.** A command's *subject*, the one
thing it acts on (a topic, a consumer group, a message or transaction id, a
runtime key), is its positional argument: ``halfmoon topic create orders``,
``halfmoon message send orders --body hi``, ``halfmoon consumer status billing``.
Everything else is an option, required or not: addresses (``--admin``,
``--db``, ``--target``, ``--coordinator``), a second object that qualifies the first
(``consumer reset-offset billing --topic orders``), times, counts, filters.
Commands that act on everything of a kind (``topic list``, ``stats``) take no
positional. mqadmin spells every argument as a flag (``updateTopic -t NAME``);
halfmoon's commands already name their object family, so the object's name
reads as the next word, as in git, kubectl or docker, and most commands
shipped that way. tests/cli/test_convention.py walks the whole tree and fails
on a command that breaks this.

A flag spelling that shipped before (``message send --topic orders``) is still
accepted through :func:`subject`'s ``deprecated_flag``, with one warning line
on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from halfmoon import environment
from halfmoon.cli import credentials
from halfmoon.cli.admin_client import AdminClient, CliError, default_admin_url, default_namespace
from halfmoon.errors import EXIT_USAGE


class UsageError(CliError):
    """The command line itself is wrong (exit status 2)."""

    def __init__(self, message: str, code: str | None = None, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message, code, exit_code)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Old flag spelling of this command's subject -> its metavar.
        self.deprecated_subject_flags: dict[str, str] = {}

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')", "USAGE")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if args is not None and self.deprecated_subject_flags:
            args = self._undeprecate(list(args))
        return super().parse_known_args(args, namespace)

    def _undeprecate(self, args: list[str]) -> list[str]:
        """Turn ``--topic X`` into the positional ``X``, with one warning line."""
        subjects: list[str] = []
        kept: list[str] = []
        used: set[str] = set()
        i = 0
        while i < len(args):
            token = args[i]
            if token == "--":
                kept.extend(args[i:])
                break
            flag, eq, value = token.partition("=")
            if flag in self.deprecated_subject_flags and (eq or i + 1 < len(args)):
                if not eq:
                    i += 1
                    value = args[i]
                subjects.append(value)
                used.add(flag)
            else:
                kept.append(token)
            i += 1
        for flag in sorted(used):
            metavar = self.deprecated_subject_flags[flag]
            print(
                f"halfmoon: warning: '{self.prog} {flag} {metavar}' is deprecated;"
                f" write '{self.prog} {metavar}'",
                file=sys.stderr,
            )
        # The subject is the only positional, so it can go first.
        return subjects + kept


def new_parser(prog: str, **kwargs: Any) -> argparse.ArgumentParser:
    return _Parser(prog=prog, **kwargs)


def subject(
    parser: argparse.ArgumentParser,
    dest: str,
    metavar: str,
    help: str,
    nargs: str | None = None,
    deprecated_flag: str | None = None,
) -> None:
    """Add the command's subject, its positional argument (see the convention above).

    ``deprecated_flag`` is the option spelling of it that shipped earlier; it
    keeps working, with a warning.
    """
    parser.add_argument(dest, metavar=metavar, nargs=nargs, help=help)
    if deprecated_flag is not None:
        assert isinstance(parser, _Parser), "deprecated flags need halfmoon's parser"
        parser.deprecated_subject_flags[deprecated_flag] = metavar


def leaf_commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable command under ``parser``, with its words (``("topic", "create")``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from leaf_commands(child, (*path, name))
            return
    yield path, parser


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
    common.add_argument(
        "--access-key",
        metavar="AK",
        default=None,
        help="admin API user (default: $HALFMOON_ACCESS_KEY, else the credentials file)",
    )
    common.add_argument(
        "--secret-key",
        metavar="SK",
        default=None,
        help="its secret key (visible in ps: prefer $HALFMOON_SECRET_KEY or the credentials "
        "file, see docs/security.md)",
    )
    common.add_argument(
        "--admin-ca",
        metavar="FILE",
        default=None,
        help="CA bundle of an HTTPS admin API (default: $HALFMOON_ADMIN_CA)",
    )
    return common


# The epilog of the commands that own a data directory (serve, broker).
DATA_DIR_EXIT_STATUS = (
    "exit status: 0 stopped cleanly; 1 failed (a port in use: UNAVAILABLE); 2 the command line "
    "or configuration is wrong; 3 another live process holds the data directory "
    "(DATA_DIR_LOCKED: nothing in it was touched; see docs/storage-format.md)"
)


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
    return AdminClient(
        args.admin or default_admin_url(),
        namespace=namespace,
        credentials=credentials.resolve(
            getattr(args, "access_key", None), getattr(args, "secret_key", None)
        ),
        ca_file=getattr(args, "admin_ca", None) or environment.ADMIN_CA.get(),
    )


def emit(args: argparse.Namespace, data: Any, human: Callable[[], str]) -> None:
    """Print ``data`` as JSON under ``--json``, else the text ``human()`` renders.

    ``data`` is a JSON object, never a bare list: the admin API's answer where the
    command makes one call (a listing under its plural name, ``{"topics": [...]}``),
    so scripts read the same shape from the CLI and the API and a field can be
    added later without breaking them.
    """
    if not isinstance(data, dict):
        raise TypeError(f"--json output must be an object, not {type(data).__name__}")
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
