"""``halfmoon topic create|list|describe|status|route|allocate|update|delete|lite-list|…``.

``status`` is RocketMQ's topicStatus (offsets per queue, last store time);
``route`` its topicRoute (which broker serves which queue, with what permission);
``allocate`` its allocateMQ (which queues each member of a pull-consumer group
reads, computed as halfmoon's ``PullConsumer`` computes it).
"""

from __future__ import annotations

import argparse
from typing import Any

from halfmoon.cli.admin_client import quote
from halfmoon.cli.parser import UsageError, add_command, client, emit, positive_int
from halfmoon.cli.table import columns_for, format_ms, render_record, render_table

TOPIC_TYPES = ("normal", "fifo", "delay", "transaction", "priority", "lite", "mixed")
PERMS = ("rw", "r", "w")

TOPIC_COLUMNS = [
    ("name", "NAME"),
    ("message_type", "TYPE"),
    ("queue_count", "QUEUES"),
    ("perm", "PERM"),
    ("read_queue_count", "READ QUEUES"),
    ("created_ms", "CREATED"),
]
QUEUE_COLUMNS = [
    ("queue_id", "QUEUE"),
    ("min_offset", "MIN OFFSET"),
    ("max_offset", "MAX OFFSET"),
    ("messages", "MESSAGES"),
    ("perm", "PERM"),
    ("last_stored", "LAST STORED"),
]
HIDDEN_QUEUE_KEYS = ("topic", "last_store_timestamp")


def register(commands: argparse._SubParsersAction) -> None:
    topic = commands.add_parser(
        "topic", help="create, list, describe, update and delete topics; offsets and routes"
    )
    sub = topic.add_subparsers(dest="topic_command", metavar="ACTION", required=True)

    create = add_command(sub, "create", create_topic, "create a topic")
    create.add_argument("name", metavar="NAME")
    create.add_argument(
        "--type",
        choices=TOPIC_TYPES,
        default="normal",
        help="message type it accepts (default normal); priority: a message's priority is "
        "its queue, highest consumed first; lite: a parent of lite topics",
    )
    create.add_argument(
        "--queues",
        type=positive_int,
        default=None,
        help="number of queues (default: the broker's default_queue_count)",
    )
    create.add_argument(
        "--brokers",
        metavar="A,B",
        default=None,
        help="cluster mode: place the queues on these brokers, round-robin in this order "
        "(default: spread over every live broker; mqadmin updateTopic -b)",
    )
    create.add_argument(
        "--perm",
        choices=PERMS,
        default="rw",
        help="permissions: rw, r (read only) or w (write only)",
    )

    add_command(sub, "list", list_topics, "list topics")

    describe = add_command(
        sub, "describe", describe_topic, "show a topic and the offsets of its queues"
    )
    describe.add_argument("name", metavar="NAME")

    update = add_command(
        sub, "update", update_topic, "change a topic's queues, permissions or type"
    )
    update.add_argument("name", metavar="NAME")
    update.add_argument("--queues", type=positive_int, default=None)
    update.add_argument("--perm", choices=PERMS, default=None)
    update.add_argument("--type", choices=TOPIC_TYPES, default=None)

    delete = add_command(sub, "delete", delete_topic, "delete a topic")
    delete.add_argument("name", metavar="NAME")

    clean = add_command(
        sub,
        "clean-unused",
        clean_unused_topics,
        "cluster mode: delete the topics brokers hold that etcd does not route "
        "(mqadmin's cleanUnusedTopic)",
    )
    clean.add_argument("--dry-run", action="store_true", help="only list them, delete nothing")

    status = add_command(
        sub, "status", topic_status, "min/max offset and last store time per queue"
    )
    status.add_argument("name", metavar="NAME")

    route = add_command(
        sub, "route", topic_route, "which broker serves each queue, and its permissions"
    )
    route.add_argument("name", metavar="NAME")

    allocate = add_command(
        sub,
        "allocate",
        allocate_queues,
        "which readable queues each pull consumer of a group would read",
    )
    allocate.add_argument("name", metavar="NAME")
    allocate.add_argument(
        "--clients",
        required=True,
        metavar="ID,ID,...",
        help="the group's members (client ids), comma-separated",
    )
    allocate.add_argument(
        "--strategy",
        choices=("average", "consistent_hash"),
        default="average",
        help="PullConsumer's allocation strategy (default average, RocketMQ's "
        "AllocateMessageQueueAveragely)",
    )

    lite_list = add_command(
        sub, "lite-list", list_lite_topics, "lite topics of a lite topic, and who subscribes"
    )
    lite_list.add_argument("name", metavar="NAME")
    lite_delete = add_command(
        sub,
        "lite-delete",
        delete_lite_topic,
        "delete one lite topic (its subscribers are told to unsubscribe)",
    )
    lite_delete.add_argument("name", metavar="NAME")
    lite_delete.add_argument(
        "--lite-topic", dest="lite_topic", required=True, help="the lite topic to delete"
    )


def summary(topic: dict[str, Any]) -> str:
    return (
        f"{topic.get('message_type', '?')}, {topic.get('queue_count', '?')} queues, "
        f"perm {topic.get('perm', '?')}"
    )


def create_topic(args: argparse.Namespace) -> None:
    body: dict[str, Any] = {"name": args.name, "message_type": args.type, "perm": args.perm}
    if args.queues is not None:
        body["queue_count"] = args.queues
    if args.brokers:
        body["brokers"] = [b.strip() for b in args.brokers.split(",") if b.strip()]
    topic = client(args).post("/v1/topics", body)
    emit(args, topic, lambda: f"created topic '{topic['name']}' ({summary(topic)})")


def list_topics(args: argparse.Namespace) -> None:
    answer = client(args).get("/v1/topics")
    topics = answer["topics"]
    emit(
        args,
        answer,
        lambda: render_table(topics, columns_for(topics, TOPIC_COLUMNS)) if topics else "no topics",
    )


def _queue_rows(queues: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            **{k: v for k, v in q.items() if k not in HIDDEN_QUEUE_KEYS},
            "messages": q.get("max_offset", 0) - q.get("min_offset", 0),
            "last_stored": format_ms(q.get("last_store_timestamp")),
        }
        for q in queues
    ]


def topic_status(args: argparse.Namespace) -> None:
    answer = client(args).get(f"/v1/topics/{quote(args.name)}/status")
    rows = _queue_rows(answer["queues"])

    def human() -> str:
        total = sum(r["messages"] for r in rows)
        return (
            f"{render_table(rows, columns_for(rows, QUEUE_COLUMNS))}\n\n{len(rows)} queues, "
            f"{total} messages retained"
        )

    emit(args, answer, human)


def topic_route(args: argparse.Namespace) -> None:
    answer = client(args).get(f"/v1/topics/{quote(args.name)}/route")
    queues = [
        {**q, "accepted_types": ",".join(q.get("accepted_types") or [])} for q in answer["queues"]
    ]
    columns = [
        ("broker", "BROKER"),
        ("address", "ADDRESS"),
        ("queue_id", "QUEUE"),
        ("perm", "PERM"),
        ("accepted_types", "ACCEPTS"),
    ]
    emit(args, answer, lambda: render_table(queues, columns))


def allocate_queues(args: argparse.Namespace) -> None:
    # Here, not at the top: halfmoon.client imports grpc, which the rest of the CLI does not need.
    from halfmoon.client.allocation import strategy_named

    members = sorted({c.strip() for c in args.clients.split(",") if c.strip()})
    if not members:
        raise UsageError("--clients names no client id")
    answer = client(args).get(f"/v1/topics/{quote(args.name)}/route")
    # The same keys and order PullConsumer allocates over: topic/broker@queue, readable only.
    keys = {
        f"{args.name}/{q['broker']}@{q['queue_id']}": q
        for q in answer["queues"]
        if "r" in str(q.get("perm", ""))
    }
    allocate = strategy_named(args.strategy)
    result = {
        member: [
            {"broker": keys[k]["broker"], "queue_id": keys[k]["queue_id"]}
            for k in allocate(sorted(keys), members, member)
        ]
        for member in members
    }
    data = {"topic": args.name, "strategy": args.strategy, "allocation": result}

    def human() -> str:
        rows = [
            {
                "client_id": member,
                "queues": ", ".join(f"{q['broker']}@{q['queue_id']}" for q in queues) or "-",
            }
            for member, queues in result.items()
        ]
        return render_table(rows, [("client_id", "CLIENT ID"), ("queues", "QUEUES")])

    emit(args, data, human)


def describe_topic(args: argparse.Namespace) -> None:
    api = client(args)
    topic = api.get(f"/v1/topics/{quote(args.name)}")
    queues = api.get(f"/v1/topics/{quote(args.name)}/status")["queues"]
    data = {**topic, "queues": queues}

    def human() -> str:
        head = render_record(topic)
        rows = _queue_rows(queues)
        return head + "\n\n" + render_table(rows, columns_for(rows, QUEUE_COLUMNS))

    emit(args, data, human)


def update_topic(args: argparse.Namespace) -> None:
    body: dict[str, Any] = {}
    if args.queues is not None:
        body["queue_count"] = args.queues
    if args.perm is not None:
        body["perm"] = args.perm
    if args.type is not None:
        body["message_type"] = args.type
    if not body:
        raise UsageError("nothing to update: give --queues, --perm or --type", "USAGE")
    topic = client(args).patch(f"/v1/topics/{quote(args.name)}", body)
    emit(args, topic, lambda: f"updated topic '{topic['name']}' ({summary(topic)})")


def delete_topic(args: argparse.Namespace) -> None:
    result = client(args).delete(f"/v1/topics/{quote(args.name)}")
    emit(args, result, lambda: f"deleted topic '{args.name}'")


def clean_unused_topics(args: argparse.Namespace) -> None:
    api = client(args)
    path = "/v1/cluster/unused-topics"
    answer = api.get(path) if args.dry_run else api.delete(path)
    rows = answer["topics"]

    def human() -> str:
        if not rows:
            return "no broker holds a topic etcd does not route"
        verb = "deleted" if answer["deleted"] else "would delete (--dry-run)"
        table = render_table(rows, [("broker", "BROKER"), ("topic", "TOPIC")])
        return f"{table}\n\n{verb}: {len(rows)}"

    emit(args, answer, human)


LITE_COLUMNS = [
    ("lite_topic", "LITE TOPIC"),
    ("min_offset", "MIN OFFSET"),
    ("max_offset", "MAX OFFSET"),
    ("subscribers", "SUBSCRIBERS"),
]


def list_lite_topics(args: argparse.Namespace) -> None:
    answer = client(args).get(f"/v1/topics/{quote(args.name)}/lite-topics")
    rows = answer["lite_topics"]

    def human() -> str:
        if not rows:
            return f"topic '{args.name}' has no lite topics"
        return render_table(rows, LITE_COLUMNS) + f"\n\n{len(rows)} lite topics"

    emit(args, answer, human)


def delete_lite_topic(args: argparse.Namespace) -> None:
    path = f"/v1/topics/{quote(args.name)}/lite-topics/{quote(args.lite_topic)}"
    result = client(args).delete(path)
    emit(
        args,
        result,
        lambda: (
            f"deleted lite topic '{args.lite_topic}' of '{args.name}' "
            f"({result.get('notified', 0)} subscribers told)"
        ),
    )
