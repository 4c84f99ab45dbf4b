"""``halfmoon transaction list|parked|commit ID|rollback ID|resume ID`` (and
``group-commit|group-rollback``).

An operator's view of the transactions the broker is still waiting on: the
pending ones (half messages without a decision, with their age and the checks
sent so far), the ones parked after ``transaction.check_max`` unanswered
checks, and a hand decision on any of them. A decision is durable when the
command returns; deciding a transaction the opposite way of an earlier
decision fails with TRANSACTION_ALREADY_ENDED.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from halfmoon.cli.admin_client import quote
from halfmoon.cli.parser import add_command, client, emit, positive_int
from halfmoon.cli.table import render_record, render_table

TRANSACTION_COLUMNS = [
    ("topic", "TOPIC"),
    ("message_id", "MESSAGE ID"),
    ("keys", "KEYS"),
    ("age_ms", "AGE"),
    ("checks_sent", "CHECKS"),
    ("state", "STATE"),
    ("transaction_group", "GROUP"),
    ("transaction_id", "TRANSACTION ID"),
]


def register(commands: argparse._SubParsersAction) -> None:
    txn = commands.add_parser(
        "transaction", help="list pending and parked transactions; commit, roll back or resume one"
    )
    sub = txn.add_subparsers(dest="transaction_command", metavar="ACTION", required=True)

    listing = add_command(sub, "list", list_transactions, "undecided transactions, oldest first")
    listing.add_argument("--topic", default=None, help="only this topic's")
    listing.add_argument(
        "--limit", type=positive_int, default=None, help="at most this many (default 1000)"
    )

    parked = add_command(sub, "parked", list_parked, "transactions parked after the check limit")
    parked.add_argument(
        "--limit", type=positive_int, default=None, help="at most this many (default 1000)"
    )

    for name, what in (("commit", "commit a transaction (publish its message)"),
                       ("rollback", "roll back a transaction (discard its message)")):  # fmt: skip
        decide = add_command(sub, name, decide_transaction, what)
        decide.add_argument(
            "transaction_id", metavar="ID", help="the transaction id (see 'transaction list')"
        )
        decide.set_defaults(resolution=name)

    resume = add_command(
        sub, "resume", resume_transaction, "put a parked transaction back under checks"
    )
    resume.add_argument("transaction_id", metavar="ID")

    for name, resolution in (("group-commit", "commit"), ("group-rollback", "rollback")):
        group = add_command(
            sub,
            name,
            decide_group,
            f"{'roll back' if resolution == 'rollback' else resolution} every member of a "
            "transaction group",
        )
        group.add_argument("group", metavar="GROUP", help="the transaction group id")
        group.set_defaults(resolution=resolution)


def _rows(transactions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for txn in transactions:
        row = dict(txn)
        row["keys"] = ",".join(txn.get("keys") or []) or None
        rows.append(row)
    return rows


def _table(transactions: Sequence[Mapping[str, Any]], empty: str) -> str:
    if not transactions:
        return empty
    rows = _rows(transactions)
    columns = [
        c
        for c in TRANSACTION_COLUMNS
        if c[0] != "transaction_group" or any(r.get(c[0]) for r in rows)
    ]
    return render_table(rows, columns)


def list_transactions(args: argparse.Namespace) -> None:
    answer = client(args).get("/v1/transactions", topic=args.topic, limit=args.limit)
    emit(args, answer, lambda: _table(answer["transactions"], "no pending transactions"))


def list_parked(args: argparse.Namespace) -> None:
    answer = client(args).get("/v1/transactions/parked", limit=args.limit)
    emit(args, answer, lambda: _table(answer["transactions"], "no parked transactions"))


def decide_transaction(args: argparse.Namespace) -> None:
    path = f"/v1/transactions/{quote(args.transaction_id)}/{args.resolution}"
    answer = client(args).post(path, {})
    state = str(answer.get("state", "?")).replace("_", " ")
    emit(args, answer, lambda: f"transaction {args.transaction_id} is {state}")


def resume_transaction(args: argparse.Namespace) -> None:
    info = client(args).post(f"/v1/transactions/{quote(args.transaction_id)}/resume", {})
    emit(
        args,
        info,
        lambda: (
            f"transaction {args.transaction_id} is checked again from the next scan\n\n"
            + render_record(_rows([info])[0])
        ),
    )


def decide_group(args: argparse.Namespace) -> None:
    answer = client(args).post(f"/v1/transaction-groups/{quote(args.group)}/{args.resolution}", {})
    state = str(answer.get("state", "?")).replace("_", " ")
    emit(
        args,
        answer,
        lambda: (
            f"transaction group {args.group} is {state} ({answer.get('members_decided', 0)} "
            "members decided now)"
        ),
    )
