"""``halfmoon user …`` and ``halfmoon acl …``: mqadmin's createUser … listAcl over the admin API.

A user's secret key is given with ``--user-secret`` or, kept out of ``ps``
and shell history, read from standard input with ``--user-secret-stdin``.
No command ever prints a secret key.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from halfmoon.cli.admin_client import quote
from halfmoon.cli.parser import UsageError, add_command, client, emit
from halfmoon.cli.table import render_table

USER_COLUMNS = [("access_key", "ACCESS KEY"), ("user_type", "TYPE"), ("enabled", "ENABLED")]
ACL_COLUMNS = [
    ("subject", "SUBJECT"),
    ("resource", "RESOURCE"),
    ("actions", "ACTIONS"),
    ("source_ips", "SOURCE IPS"),
    ("decision", "DECISION"),
]


def register(commands: argparse._SubParsersAction) -> None:
    user = commands.add_parser("user", help="create, update, delete and list users")
    users = user.add_subparsers(dest="user_command", metavar="ACTION", required=True)
    for name, handler, text in (
        ("create", create_user, "create a user (mqadmin createUser)"),
        ("update", update_user, "change a user's secret, type or enabled flag (updateUser)"),
    ):
        command = add_command(users, name, handler, text)
        # Not "access_key": that is the caller's own (--access-key, admin_options).
        command.add_argument("user", metavar="ACCESS_KEY")
        command.add_argument("--user-secret", metavar="SK", default=None, help="its secret key")
        command.add_argument(
            "--user-secret-stdin", action="store_true", help="read its secret key from stdin"
        )
        command.add_argument("--type", dest="user_type", choices=("Super", "Normal"))
        command.add_argument("--disabled", action="store_true", help="refuse its requests")
        if name == "update":
            command.add_argument("--enabled", action="store_true", help="accept its requests")
    delete = add_command(users, "delete", delete_user, "delete a user and its ACL (deleteUser)")
    delete.add_argument("user", metavar="ACCESS_KEY")
    add_command(users, "list", list_users, "list users, never their secrets (listUser)")

    acl = commands.add_parser("acl", help="create, update, delete, get and list ACLs")
    acls = acl.add_subparsers(dest="acl_command", metavar="ACTION", required=True)
    for name, handler, text in (
        ("create", create_acl, "add policy entries to a user's ACL (mqadmin createAcl)"),
        ("update", update_acl, "replace a user's entries for these resources (updateAcl)"),
    ):
        command = add_command(acls, name, handler, text)
        command.add_argument("subject", metavar="SUBJECT", help="User:ACCESS_KEY")
        command.add_argument(
            "--resource",
            action="append",
            required=True,
            help="Cluster, Namespace:NS, Topic:NAME or Group:NAME; NAME* matches by prefix "
            "(repeatable)",
        )
        command.add_argument(
            "--actions",
            required=True,
            help="comma-separated: Pub,Sub,Create,Update,Delete,Get,List,All",
        )
        command.add_argument("--source-ip", action="append", default=[], help="address or CIDR")
        command.add_argument("--decision", choices=("Allow", "Deny"), default="Allow")
    delete = add_command(acls, "delete", delete_acl, "delete a user's ACL or one entry (deleteAcl)")
    delete.add_argument("subject", metavar="SUBJECT")
    delete.add_argument("--resource", default=None, help="only this resource's entry")
    get = add_command(acls, "get", get_acl, "show a user's ACL (getAcl)")
    get.add_argument("subject", metavar="SUBJECT")
    listing = add_command(acls, "list", list_acls, "list ACLs (listAcl)")
    listing.add_argument("--subject", default=None)
    listing.add_argument("--resource", default=None)


def _secret(args: argparse.Namespace, required: bool) -> str | None:
    if args.user_secret_stdin:
        secret = sys.stdin.readline().rstrip("\r\n")
        if not secret:
            raise UsageError("--user-secret-stdin read an empty line")
        return secret
    if args.user_secret is None and required:
        raise UsageError("give the user's secret key: --user-secret SK or --user-secret-stdin")
    return args.user_secret


def _describe(user: dict[str, Any]) -> str:
    state = "enabled" if user.get("enabled") else "disabled"
    return f"user '{user['access_key']}' ({user.get('user_type')}, {state})"


def create_user(args: argparse.Namespace) -> None:
    body: dict[str, Any] = {
        "access_key": args.user,
        "secret_key": _secret(args, required=True),
        "user_type": args.user_type or "Normal",
        "enabled": not args.disabled,
    }
    user = client(args).post("/v1/users", body)
    emit(args, user, lambda: f"created {_describe(user)}")


def update_user(args: argparse.Namespace) -> None:
    if args.disabled and args.enabled:
        raise UsageError("--enabled and --disabled contradict each other")
    body: dict[str, Any] = {}
    secret = _secret(args, required=False)
    if secret is not None:
        body["secret_key"] = secret
    if args.user_type:
        body["user_type"] = args.user_type
    if args.disabled or args.enabled:
        body["enabled"] = bool(args.enabled)
    if not body:
        raise UsageError("nothing to change: give --user-secret, --type, --enabled or --disabled")
    user = client(args).patch(f"/v1/users/{quote(args.user)}", body)
    emit(args, user, lambda: f"updated {_describe(user)}")


def delete_user(args: argparse.Namespace) -> None:
    answer = client(args).delete(f"/v1/users/{quote(args.user)}")
    emit(args, answer, lambda: f"deleted user '{args.user}'")


def list_users(args: argparse.Namespace) -> None:
    answer = client(args).get("/v1/users")
    users = answer["users"]
    emit(args, answer, lambda: render_table(users, USER_COLUMNS) if users else "no users")


def _policies(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [
        {
            "resource": resource,
            "actions": [a.strip() for a in args.actions.split(",") if a.strip()],
            "source_ips": args.source_ip,
            "decision": args.decision,
        }
        for resource in args.resource
    ]


def _rows(acls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            **entry,
            "subject": acl["subject"],
            "actions": ",".join(entry["actions"]),
            "source_ips": ",".join(entry["source_ips"]) or "any",
        }
        for acl in acls
        for entry in acl["policies"]
    ]


def create_acl(args: argparse.Namespace) -> None:
    answer = client(args).post("/v1/acls", {"subject": args.subject, "policies": _policies(args)})
    emit(args, answer, lambda: render_table(_rows([answer]), ACL_COLUMNS))


def update_acl(args: argparse.Namespace) -> None:
    answer = client(args).patch(f"/v1/acls/{quote(args.subject)}", {"policies": _policies(args)})
    emit(args, answer, lambda: render_table(_rows([answer]), ACL_COLUMNS))


def delete_acl(args: argparse.Namespace) -> None:
    path = f"/v1/acls/{quote(args.subject)}"
    if args.resource:
        path += f"?resource={quote(args.resource)}"
    answer = client(args).delete(path)
    what = (
        f"{args.subject}'s entry for {args.resource}" if args.resource else f"{args.subject}'s ACL"
    )
    emit(args, answer, lambda: f"deleted {what}")


def get_acl(args: argparse.Namespace) -> None:
    answer = client(args).get(f"/v1/acls/{quote(args.subject)}")
    emit(args, answer, lambda: render_table(_rows([answer]), ACL_COLUMNS))


def list_acls(args: argparse.Namespace) -> None:
    answer = client(args).get("/v1/acls", subject=args.subject, resource=args.resource)
    rows = _rows(answer["acls"])
    emit(args, answer, lambda: render_table(rows, ACL_COLUMNS) if rows else "no ACLs")
