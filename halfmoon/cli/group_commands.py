"""``halfmoon group create|list|describe|update|delete``.

``update`` is RocketMQ's updateSubGroup: consume enabled, where a new group
starts (``--from earliest`` is consumeFromMinEnable), broadcast, retry count
(``--max-attempts``: deliveries before the dead-letter topic) and FIFO.
"""

from __future__ import annotations

import argparse
from typing import Any

from halfmoon.cli.admin_client import quote
from halfmoon.cli.parser import UsageError, add_command, client, emit, positive_int
from halfmoon.cli.table import columns_for, render_record, render_table

GROUP_COLUMNS = [
    ("name", "NAME"),
    ("fifo", "FIFO"),
    ("max_delivery_attempts", "MAX ATTEMPTS"),
    ("consume_from", "FROM"),
    ("consume_enabled", "ENABLED"),
    ("broadcast", "BROADCAST"),
]
PROGRESS_COLUMNS = [
    ("topic", "TOPIC"),
    ("queue_id", "QUEUE"),
    ("committed_offset", "COMMITTED"),
    ("max_offset", "MAX OFFSET"),
    ("lag", "LAG"),
    ("ready", "READY"),  # what a consumer can be handed now: not yet delivered, or requeued
    ("inflight", "IN FLIGHT"),
    ("retrying", "RETRYING"),
]


def register(commands: argparse._SubParsersAction) -> None:
    group = commands.add_parser(
        "group", help="create, list, describe, update and delete consumer groups"
    )
    sub = group.add_subparsers(dest="group_command", metavar="ACTION", required=True)

    create = add_command(sub, "create", create_group, "create a consumer group")
    create.add_argument(
        "name", metavar="NAME", help="the group's name: 1 to 120 letters, digits, '_' or '-'"
    )
    create.add_argument("--fifo", action="store_true", help="deliver each message group in order")
    create.add_argument(
        "--max-attempts",
        type=positive_int,
        default=None,
        help="deliveries before the dead-letter topic (default 17)",
    )
    create.add_argument(
        "--from",
        dest="consume_from",
        choices=("earliest", "latest", "auto"),
        default=None,
        help="where a new group starts: earliest, latest or auto (the queue's first message while "
        "hot, else its last); default: the broker's broker.default_consume_from (auto)",
    )

    add_command(sub, "list", list_groups, "list consumer groups")

    describe = add_command(
        sub, "describe", describe_group, "show a group and its progress (lag per queue)"
    )
    describe.add_argument("name", metavar="NAME")
    describe.add_argument("--topic", default=None, help="only this topic's queues")

    update = add_command(
        sub, "update", update_group, "change a group's consuming, start, broadcast or retries"
    )
    update.add_argument("name", metavar="NAME")
    enabled = update.add_mutually_exclusive_group()
    enabled.add_argument(
        "--enable",
        dest="consume_enabled",
        action="store_const",
        const=True,
        default=None,
        help="allow consuming",
    )
    enabled.add_argument(
        "--disable",
        dest="consume_enabled",
        action="store_const",
        const=False,
        help="refuse consuming (receive and pull fail)",
    )
    update.add_argument(
        "--from",
        dest="consume_from",
        choices=("earliest", "latest", "auto"),
        default=None,
        help="where the group starts in a topic it has not consumed (earliest: the min offset)",
    )
    broadcast = update.add_mutually_exclusive_group()
    broadcast.add_argument(
        "--broadcast",
        dest="broadcast",
        action="store_const",
        const=True,
        default=None,
        help="every consumer gets every message",
    )
    broadcast.add_argument(
        "--clustering",
        dest="broadcast",
        action="store_const",
        const=False,
        help="each message goes to one consumer of the group",
    )
    update.add_argument(
        "--max-attempts",
        type=positive_int,
        default=None,
        help="deliveries before the dead-letter topic (retry count + 1)",
    )
    fifo = update.add_mutually_exclusive_group()
    fifo.add_argument(
        "--fifo",
        dest="fifo",
        action="store_const",
        const=True,
        default=None,
        help="deliver each message group in order",
    )
    fifo.add_argument(
        "--no-fifo", dest="fifo", action="store_const", const=False, help="deliver concurrently"
    )

    delete = add_command(sub, "delete", delete_group, "delete a consumer group")
    delete.add_argument("name", metavar="NAME")

    peek = add_command(
        sub, "peek", peek_group, "show the next messages a group would get, consuming nothing"
    )
    peek.add_argument("name", metavar="NAME")
    peek.add_argument("--topic", required=True, help="the topic of the backlog")
    peek.add_argument("--limit", type=positive_int, default=20, help="at most this many (100)")
    purge = add_command(
        sub, "purge", purge_group, "skip a group's backlog in a topic (other groups keep theirs)"
    )
    purge.add_argument("name", metavar="NAME")
    purge.add_argument("--topic", required=True, help="the topic whose backlog goes")


def create_group(args: argparse.Namespace) -> None:
    body: dict[str, Any] = {"name": args.name, "fifo": args.fifo}
    if args.max_attempts is not None:
        body["max_delivery_attempts"] = args.max_attempts
    if args.consume_from is not None:
        body["consume_from"] = args.consume_from
    group = client(args).post("/v1/groups", body)
    emit(
        args,
        group,
        lambda: (
            f"created group '{group['name']}' (fifo {'on' if group.get('fifo') else 'off'}, "
            f"max attempts {group.get('max_delivery_attempts', '?')}, "
            f"from {group.get('consume_from', '?')})"
        ),
    )


def list_groups(args: argparse.Namespace) -> None:
    answer = client(args).get("/v1/groups")
    groups = answer["groups"]
    emit(
        args,
        answer,
        lambda: render_table(groups, columns_for(groups, GROUP_COLUMNS)) if groups else "no groups",
    )


def describe_group(args: argparse.Namespace) -> None:
    api = client(args)
    group = api.get(f"/v1/groups/{quote(args.name)}")
    progress = api.get(f"/v1/groups/{quote(args.name)}/progress", topic=args.topic)["queues"]
    data = {**group, "progress": progress}

    def human() -> str:
        head = render_record(group)
        if not progress:
            return head + "\n\nno progress yet (the group has consumed nothing)"
        total = sum(int(q.get("lag") or 0) for q in progress)
        rows = [{k: v for k, v in q.items() if k != "group"} for q in progress]
        table = render_table(rows, columns_for(rows, PROGRESS_COLUMNS))
        return f"{head}\n\n{table}\n\ntotal lag: {total}"

    emit(args, data, human)


def update_group(args: argparse.Namespace) -> None:
    fields = {
        "consume_enabled": args.consume_enabled,
        "consume_from": args.consume_from,
        "broadcast": args.broadcast,
        "max_delivery_attempts": args.max_attempts,
        "fifo": args.fifo,
    }
    body = {k: v for k, v in fields.items() if v is not None}
    if not body:
        raise UsageError(
            "nothing to update: give --enable/--disable, --from, --broadcast/--clustering, "
            "--max-attempts or --fifo/--no-fifo",
            "USAGE",
        )
    group = client(args).patch(f"/v1/groups/{quote(args.name)}", body)
    emit(args, group, lambda: f"updated group '{group['name']}' ({summary(group)})")


def summary(group: dict[str, Any]) -> str:
    return (
        f"consuming {'enabled' if group.get('consume_enabled', True) else 'disabled'}, "
        f"from {group.get('consume_from', '?')}, "
        f"{'broadcast' if group.get('broadcast') else 'clustering'}, "
        f"max attempts {group.get('max_delivery_attempts', '?')}, fifo "
        f"{'on' if group.get('fifo') else 'off'}"
    )


def delete_group(args: argparse.Namespace) -> None:
    result = client(args).delete(f"/v1/groups/{quote(args.name)}")
    emit(args, result, lambda: f"deleted group '{args.name}'")


PEEK_COLUMNS = [
    ("queue_id", "QUEUE"),
    ("queue_offset", "OFFSET"),
    ("message_id", "MESSAGE ID"),
    ("tag", "TAG"),
    ("body", "BODY"),
]


def peek_group(args: argparse.Namespace) -> None:
    answer = client(args).get(
        f"/v1/groups/{quote(args.name)}/peek", topic=args.topic, limit=args.limit
    )

    def human() -> str:
        head = f"{answer['backlog']} message(s) of '{args.topic}' not yet consumed by '{args.name}'"
        rows = [
            {**m, "tag": m.get("tag") or "-", "body": str(m.get("body", ""))[:60]}
            for m in answer["messages"]
        ]
        return head + ("\n\n" + render_table(rows, PEEK_COLUMNS) if rows else "")

    emit(args, answer, human)


def purge_group(args: argparse.Namespace) -> None:
    answer = client(args).post(f"/v1/groups/{quote(args.name)}/purge", {"topic": args.topic})
    emit(
        args,
        answer,
        lambda: f"purged {answer['purged']} message(s) of '{args.topic}' for group '{args.name}'",
    )
