"""``halfmoon producer status TOPIC``: which producers are connected and send to a topic;
``halfmoon producer list``: every connected producer, whatever it sends to.

RocketMQ's producerConnection (``-g GROUP -t TOPIC``). A RocketMQ 5 producer
names no producer group unless it is transactional, so the topic is the
subject here and ``--group`` narrows the list to one producer group. Only
producers holding a telemetry stream are listed: they are the ones a
transaction check can reach.
"""

from __future__ import annotations

import argparse
from typing import Any

from halfmoon.cli.admin_client import quote
from halfmoon.cli.parser import add_command, client, emit
from halfmoon.cli.table import render_table

PRODUCER_COLUMNS = [
    ("client_id", "CLIENT ID"),
    ("group", "GROUP"),
    ("peer", "ADDRESS"),
    ("language", "LANGUAGE"),
    ("version", "VERSION"),
    ("idle", "IDLE"),
]


def register(commands: argparse._SubParsersAction) -> None:
    producer = commands.add_parser("producer", help="connected producers")
    sub = producer.add_subparsers(dest="producer_command", metavar="ACTION", required=True)
    status = add_command(
        sub, "status", show_status, "producers connected now that have sent to a topic"
    )
    status.add_argument("topic", metavar="TOPIC")
    status.add_argument("--group", default=None, help="only this producer group")
    add_command(
        sub,
        "list",
        show_list,
        "every connected producer: language, version, address, topics and send rate",
    )


def _rows(clients: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**c, "group": c.get("group") or "-", "idle": f"{float(c.get('idle_seconds') or 0):.0f}s"}
        for c in clients
    ]


def show_status(args: argparse.Namespace) -> None:
    answer = client(args).get(f"/v1/topics/{quote(args.topic)}/producers", group=args.group)
    clients = answer["clients"]

    def human() -> str:
        if clients:
            return render_table(_rows(clients), PRODUCER_COLUMNS)
        if not answer.get("registry", True):
            return "connected clients are unknown here (the admin API runs without the gRPC server)"
        which = f" of group '{args.group}'" if args.group else ""
        return f"no producer{which} connected now has sent to '{args.topic}'"

    emit(args, answer, human)


LIST_COLUMNS = [
    ("client_id", "CLIENT ID"),
    ("group", "GROUP"),
    ("peer", "ADDRESS"),
    ("language", "LANGUAGE"),
    ("version", "VERSION"),
    ("topics", "TOPICS"),
    ("sent", "SENT"),
    ("rate", "RATE/S"),
]


def show_list(args: argparse.Namespace) -> None:
    """``GET /v1/producers``: the dashboard's Producers page as a table."""
    answer = client(args).get("/v1/producers")
    clients = answer["clients"]

    def human() -> str:
        if not answer.get("registry", True):
            return "connected clients are unknown here (the admin API runs without the gRPC server)"
        if not clients:
            return "no producer is connected now"
        rows = [
            {
                **row,
                "topics": ",".join(row.get("publishes") or []) or "-",
                "sent": row.get("messages_sent", 0),
                "rate": f"{float(row.get('send_rate') or 0):.1f}",
            }
            for row in _rows(clients)
        ]
        return render_table(rows, LIST_COLUMNS)

    emit(args, answer, human)
