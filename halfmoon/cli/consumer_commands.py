"""``halfmoon consumer progress|status|lag|clone-offset|reset-offset``: how far groups are,
who is connected.

RocketMQ's consumerProgress, consumerStatus / consumerConnection,
brokerConsumeStats (``lag``: every group's queues, filtered by a minimum lag),
cloneGroupOffset (``clone-offset``) and resetOffsetByTime. Progress is per
queue (committed offset, broker max offset, lag, in flight), then per
connected client (what it subscribes to), then the group's consume rate and
total lag. halfmoon's consumers receive by pop, so a queue is not owned by one
client as in RocketMQ's push model: the client table lists every connected
consumer of the group rather than one per queue.
"""

from __future__ import annotations

import argparse
from typing import Any

from halfmoon.cli.admin_client import quote
from halfmoon.cli.parser import add_command, client, emit
from halfmoon.cli.table import format_ms, render_table
from halfmoon.cli.timearg import TIME_HELP, parse_time_ms

PROGRESS_COLUMNS = [
    ("topic", "TOPIC"),
    ("queue_id", "QUEUE"),
    ("max_offset", "BROKER OFFSET"),
    ("committed_offset", "CONSUMER OFFSET"),
    ("lag", "LAG"),
    ("ready", "READY"),  # what a consumer can be handed now: not yet delivered, or requeued
    ("inflight", "IN FLIGHT"),
    ("retrying", "RETRYING"),
]
CLIENT_COLUMNS = [
    ("client_id", "CLIENT ID"),
    ("client_type", "TYPE"),
    ("peer", "ADDRESS"),
    ("language", "LANGUAGE"),
    ("version", "VERSION"),
    ("subscribes", "SUBSCRIBES"),
    ("idle", "IDLE"),
]


def register(commands: argparse._SubParsersAction) -> None:
    consumer = commands.add_parser(
        "consumer", help="consumer progress, connected clients, offset reset"
    )
    sub = consumer.add_subparsers(dest="consumer_command", metavar="ACTION", required=True)

    progress = add_command(
        sub, "progress", show_progress, "lag per queue and per client, consume rate"
    )
    progress.add_argument("group", metavar="GROUP")
    progress.add_argument("--topic", default=None, help="only this topic's queues")

    status = add_command(sub, "status", show_status, "who is connected and what they subscribe to")
    status.add_argument("group", metavar="GROUP")

    lag = add_command(
        sub, "lag", show_lag, "every group's lag per queue (RocketMQ's brokerConsumeStats)"
    )
    lag.add_argument("--topic", default=None, help="only this topic's queues")
    lag.add_argument(
        "--min-lag",
        type=int,
        default=0,
        metavar="N",
        help="only queues at least N messages behind (mqadmin's -l diffLevel; default 0)",
    )

    clone = add_command(
        sub, "clone-offset", clone_offset, "give another group this group's committed offsets"
    )
    clone.add_argument("group", metavar="GROUP")
    clone.add_argument("--to", required=True, metavar="GROUP", help="the group that gets them")
    clone.add_argument("--topic", default=None, help="only this topic (default: every topic)")

    reset = add_command(
        sub, "reset-offset", reset_offset, "move the group to a point in time in a topic"
    )
    reset.add_argument("group", metavar="GROUP")
    reset.add_argument("--topic", required=True)
    reset.add_argument(
        "--time",
        dest="timestamp",
        type=parse_time_ms,
        required=True,
        metavar="TIME",
        help=f"the first message stored at or after it is consumed next: {TIME_HELP}",
    )


def _client_rows(clients: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for c in clients:
        subs = c.get("subscriptions") or []
        text = ", ".join(
            f"{s['topic']}("
            f"{s['filter'] if s.get('filter_type') == 'tag' else 'sql: ' + s['filter']})"
            for s in subs
        )
        rows.append(
            {
                **c,
                "client_type": str(c.get("client_type", "")).lower().replace("_consumer", ""),
                "subscribes": text or "-",
                "idle": f"{float(c.get('idle_seconds') or 0):.0f}s",
            }
        )
    return rows


def show_progress(args: argparse.Namespace) -> None:
    api = client(args)
    group = quote(args.group)
    queues = api.get(f"/v1/groups/{group}/progress", topic=args.topic)["queues"]
    clients = api.get(f"/v1/groups/{group}/clients")["clients"]
    rows = api.get("/v1/statistics", group=args.group, topic=args.topic)["rows"]
    tps = round(sum(float(r.get("per_second") or 0) for r in rows), 3)
    total_lag = sum(int(q.get("lag") or 0) for q in queues)
    data = {
        "group": args.group,
        "topic": args.topic,
        "queues": queues,
        "clients": clients,
        "consume_tps": tps,
        "total_lag": total_lag,
    }

    def human() -> str:
        parts = []
        if queues:
            parts.append(render_table(queues, PROGRESS_COLUMNS))
        else:
            parts.append(f"group '{args.group}' has consumed nothing yet")
        if clients:
            parts.append(render_table(_client_rows(clients), CLIENT_COLUMNS))
        else:
            parts.append("no consumer of this group is connected")
        parts.append(f"consume TPS: {tps:.2f}\ntotal lag: {total_lag}")
        return "\n\n".join(parts)

    emit(args, data, human)


def show_status(args: argparse.Namespace) -> None:
    answer = client(args).get(f"/v1/groups/{quote(args.group)}/clients")
    clients = answer["clients"]

    def human() -> str:
        if not clients:
            if not answer.get("registry", True):
                return (
                    "connected clients are unknown here (the admin API runs without the gRPC "
                    "server)"
                )
            return f"no consumer of group '{args.group}' is connected"
        return render_table(_client_rows(clients), CLIENT_COLUMNS)

    emit(args, answer, human)


def show_lag(args: argparse.Namespace) -> None:
    api = client(args)
    rows: list[dict[str, Any]] = []
    for group in api.get("/v1/groups")["groups"]:
        answer = api.get(f"/v1/groups/{quote(group['name'])}/progress", topic=args.topic)
        rows.extend(q for q in answer["queues"] if int(q.get("lag") or 0) >= args.min_lag)
    rows.sort(key=lambda q: (-int(q.get("lag") or 0), q["group"], q["topic"], q["queue_id"]))
    total = sum(int(q.get("lag") or 0) for q in rows)
    data = {"topic": args.topic, "min_lag": args.min_lag, "queues": rows, "total_lag": total}

    def human() -> str:
        if not rows:
            return f"no queue is {args.min_lag} or more messages behind"
        table = render_table(rows, [("group", "GROUP"), *PROGRESS_COLUMNS])
        return f"{table}\n\ntotal lag: {total}"

    emit(args, data, human)


def clone_offset(args: argparse.Namespace) -> None:
    body: dict[str, Any] = {"to": args.to}
    if args.topic is not None:
        body["topic"] = args.topic
    answer = client(args).post(f"/v1/groups/{quote(args.group)}/clone-offset", body)
    queues = answer["queues"]

    def human() -> str:
        if not queues:
            return f"group '{args.group}' has no offsets to clone"
        head = f"group '{args.to}' now consumes from group '{args.group}''s offsets"
        columns = [("topic", "TOPIC"), ("queue_id", "QUEUE"), ("offset", "NEW OFFSET")]
        return f"{head}\n\n{render_table(queues, columns)}"

    emit(args, answer, human)


def reset_offset(args: argparse.Namespace) -> None:
    answer = client(args).post(
        f"/v1/groups/{quote(args.group)}/reset-offset",
        {"topic": args.topic, "timestamp_ms": args.timestamp},
    )
    queues = answer["queues"]
    emit(
        args,
        answer,
        lambda: (
            f"reset group '{args.group}' in '{args.topic}' to {format_ms(args.timestamp)}\n\n"
            + render_table(queues, [("queue_id", "QUEUE"), ("offset", "NEW OFFSET")])
        ),
    )
