"""``halfmoon definitions export|import``: the broker's topics, groups, users, policies and
AMQP topology (vhosts, exchanges, queues, bindings) as one JSON document (RabbitMQ's
``rabbitmqctl export_definitions`` / ``import_definitions``).

``export`` writes the document ``GET /v1/definitions`` answers (to a file, or to stdout);
``import`` sends a file to ``POST /v1/definitions``, which validates all of it before it
changes anything and then creates or updates each entry, so importing twice is the same
as once. Both are for super users: the document holds users' secret keys.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from halfmoon.cli.admin_client import CliError
from halfmoon.cli.parser import add_command, client, emit

KINDS = ("topics", "groups", "users", "acls", "vhosts", "exchanges", "queues", "bindings")


def register(commands: argparse._SubParsersAction) -> None:
    definitions = commands.add_parser(
        "definitions", help="export or import topics, groups, users, policies and AMQP topology"
    )
    sub = definitions.add_subparsers(dest="definitions_command", metavar="ACTION", required=True)
    export = add_command(
        sub, "export", export_definitions, "write the definitions document (holds secret keys)"
    )
    export.add_argument(
        "file",
        nargs="?",
        type=Path,
        metavar="FILE",
        help="write it here (mode 0600); default: stdout",
    )
    load = add_command(
        sub, "import", import_definitions, "apply a definitions document (validated whole first)"
    )
    load.add_argument("file", type=Path, metavar="FILE", help="the document ('-': stdin)")
    load.add_argument(
        "--dry-run", action="store_true", help="validate and say what would change; change nothing"
    )


def export_definitions(args: argparse.Namespace) -> None:
    document = client(args).get("/v1/definitions")
    text = json.dumps(document, indent=2) + "\n"
    if args.file is None:
        sys.stdout.write(text)
        return
    try:
        # Secret keys inside: readable by its owner only, as auth/users.json is.
        fd = os.open(args.file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
    except OSError as exc:
        raise CliError(f"cannot write {args.file}: {exc.strerror}", "BAD_REQUEST") from None
    counts = ", ".join(f"{len(document.get(k, []))} {k}" for k in KINDS)
    emit(args, {"file": str(args.file), **{k: len(document.get(k, [])) for k in KINDS}},
         lambda: f"exported {counts} to {args.file}")  # fmt: skip


def _read(path: Path) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", "BAD_REQUEST") from None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise CliError(f"{path} is not JSON: {exc}", "INVALID_DEFINITIONS") from None
    if not isinstance(document, dict):
        raise CliError(f"{path} is not a definitions document (an object)", "INVALID_DEFINITIONS")
    return document


def import_definitions(args: argparse.Namespace) -> None:
    document = _read(args.file)
    path = "/v1/definitions?dry_run=true" if args.dry_run else "/v1/definitions"
    answer = client(args).post(path, document)

    def human() -> str:
        lines = []
        for action in ("created", "updated", "unchanged"):
            said = [f"{len(answer[action][k])} {k}" for k in KINDS if answer[action][k]]
            if said:
                lines.append(f"{action}: {', '.join(said)}")
        verdict = "would change (dry run)" if args.dry_run else "imported"
        return f"{verdict} {args.file}\n" + ("\n".join(lines) or "nothing in it")

    emit(args, answer, human)
