"""``halfmoon message get|query|read|send|consume|print``: find, read and send messages.

RocketMQ's queryMsgById, queryMsgByKey, queryMsgByOffset, sendMessage,
consumeMessage and printMsg. Reads go through the admin API and never touch a
consumer group: no offset moves, nothing becomes invisible.

``get ID`` searches every topic unless ``--topic`` narrows it (the id is
indexed like a key, so either way it is an index lookup per topic, not a scan);
several messages may answer one id (a dead-letter copy keeps the id).
``consume`` and ``print`` page through each queue in turn, ``consume`` up to
``--count`` messages, ``print`` everything in the time range.
"""

from __future__ import annotations

import argparse
import base64
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from halfmoon.cli.admin_client import AdminClient, CliError, quote
from halfmoon.cli.parser import UsageError, add_command, client, emit, positive_int, subject
from halfmoon.cli.progress import ProgressBar
from halfmoon.cli.table import format_ms, render_record, render_table
from halfmoon.cli.timearg import TIME_HELP, parse_time_ms

PAGE = 500  # messages per scan request
ONE_LINE_BODY = 120  # characters of a body on a one-line listing (--json has it whole)
QUERY_COLUMNS = [
    ("message_id", "MESSAGE ID"),
    ("queue_id", "QUEUE"),
    ("queue_offset", "OFFSET"),
    ("tag", "TAG"),
    ("keys", "KEYS"),
    ("store_timestamp", "STORED"),
]
RECORD_FIELDS = [
    ("message_id", "message id"),
    ("topic", "topic"),
    ("queue_id", "queue"),
    ("queue_offset", "queue offset"),
    ("commit_log_offset", "commit log offset"),
    ("tag", "tag"),
    ("keys", "keys"),
    ("message_type", "type"),
    ("message_group", "message group"),
    ("properties", "properties"),
    ("born_timestamp", "born"),
    ("store_timestamp", "stored"),
    ("born_host", "born host"),
    ("delivery_timestamp", "delivery"),
    ("body_size", "body size"),
]


def register(commands: argparse._SubParsersAction) -> None:
    message = commands.add_parser("message", help="find, read, send, consume and print messages")
    sub = message.add_subparsers(dest="message_command", metavar="ACTION", required=True)

    get = add_command(sub, "get", get_message, "show a message by id (every topic unless --topic)")
    get.add_argument("message_id", metavar="ID")
    get.add_argument("--topic", default=None, help="look only in this topic")
    get.add_argument(
        "--group",
        default=None,
        help="with --client: have that consumer of GROUP consume the message again now "
        "(mqadmin's queryMsgByUniqueKey -g -d; nothing is acked or moved)",
    )
    get.add_argument("--client", default=None, metavar="CLIENT_ID", help="see --group")

    trace = add_command(
        sub,
        "trace",
        trace_message,
        "what the broker did with a message (mqadmin queryMsgTraceById)",
    )
    trace.add_argument("message_id", metavar="ID")

    query = add_command(sub, "query", query_messages, "find messages by key within a time range")
    subject(query, "topic", "TOPIC", "the topic to search", deprecated_flag="--topic")
    query.add_argument("--key", required=True)
    _time_range(query)
    query.add_argument(
        "--limit", type=positive_int, default=64, help="at most this many (default 64)"
    )

    read = add_command(sub, "read", read_message, "show the message at a queue offset")
    subject(read, "topic", "TOPIC", "the topic to read", deprecated_flag="--topic")
    read.add_argument("--queue", type=int, required=True)
    read.add_argument("--offset", type=int, required=True)

    send = add_command(sub, "send", send_message, "send one message")
    subject(send, "topic", "TOPIC", "the topic to send to", deprecated_flag="--topic")
    body = send.add_mutually_exclusive_group(required=True)
    body.add_argument("--body", help="the body, as text")
    body.add_argument("--body-file", type=Path, help="read the body from this file ('-': stdin)")
    send.add_argument("--key", dest="keys", action="append", default=[], help="a key (repeatable)")
    send.add_argument("--tag", default=None)
    send.add_argument(
        "--queue", type=int, default=None, help="this queue (default: the broker picks)"
    )
    send.add_argument(
        "--priority", type=int, default=None, help="its priority (a priority topic's message)"
    )
    send.add_argument(
        "--lite-topic", default=None, metavar="NAME", help="its lite topic (a lite topic's message)"
    )
    send.add_argument(
        "--property",
        dest="properties",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a user property (repeatable)",
    )

    consume = add_command(
        sub,
        "consume",
        consume_messages,
        "read messages from an offset or a time, no group involved",
    )
    subject(consume, "topic", "TOPIC", "the topic to read", deprecated_flag="--topic")
    consume.add_argument(
        "--queue", type=int, default=None, help="only this queue (needed with --offset)"
    )
    consume.add_argument("--offset", type=int, default=None, help="start at this offset of --queue")
    _time_range(consume)
    consume.add_argument(
        "--count", type=positive_int, default=32, help="at most this many (default 32)"
    )
    _filters(consume)

    print_ = add_command(
        sub, "print", print_messages, "print every message in a time range, with tag counts"
    )
    subject(print_, "topic", "TOPIC", "the topic to print", deprecated_flag="--topic")
    print_.add_argument("--queue", type=int, default=None, help="only this queue")
    _time_range(print_)
    _filters(print_)
    print_.add_argument("--no-bodies", dest="bodies", action="store_false", help="headers only")
    print_.add_argument(
        "--tag-counts", action="store_true", help="count messages per tag instead of printing them"
    )


def _time_range(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--begin",
        type=parse_time_ms,
        default=None,
        metavar="TIME",
        help=f"from this store time: {TIME_HELP}",
    )
    parser.add_argument(
        "--end", type=parse_time_ms, default=None, metavar="TIME", help="up to this store time"
    )


def _filters(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--filter", default=None, metavar="TAGS", help="tag expression, e.g. 'created || paid'"
    )
    which.add_argument(
        "--sql", default=None, metavar="EXPR", help="SQL92 expression over user properties"
    )


def _check_range(args: argparse.Namespace) -> None:
    if args.begin is not None and args.end is not None and args.end < args.begin:
        raise UsageError(
            f"--end ({format_ms(args.end)}) is before --begin ({format_ms(args.begin)})", "USAGE"
        )


# -- rendering -------------------------------------------------------------------------


def body_text(message: dict[str, Any]) -> str:
    body = message.get("body")
    if body is None:
        return ""
    if message.get("body_encoding") == "base64":
        return f"(binary, {message.get('body_size')} bytes, base64) {body}"
    return str(body)


def render_message(message: dict[str, Any]) -> str:
    head = render_record(message, RECORD_FIELDS)
    return f"{head}\nbody:\n{body_text(message)}" if "body" in message else head


def one_line(message: dict[str, Any]) -> str:
    """``queue 2 offset 17  2026-01-31 12:00:00.000  tag=created keys=a,b  id=...  | body``."""
    parts = [
        f"queue {message['queue_id']} offset {message['queue_offset']}",
        format_ms(message.get("store_timestamp")) or "-",
    ]
    if message.get("tag"):
        parts.append(f"tag={message['tag']}")
    if message.get("keys"):
        parts.append("keys=" + ",".join(message["keys"]))
    parts.append(f"id={message['message_id']}")
    line = "  ".join(parts)
    if "body" not in message:
        return line
    body = " ".join(body_text(message).split())
    if len(body) > ONE_LINE_BODY:
        body = f"{body[:ONE_LINE_BODY]}... ({message.get('body_size')} bytes)"
    return f"{line}  | {body}"


# -- commands --------------------------------------------------------------------------


def get_message(args: argparse.Namespace) -> None:
    if (args.group is None) != (args.client is None):
        raise UsageError("--group and --client go together: the consumer that consumes it again")
    if args.group is not None:
        consume_directly(args)
        return
    answer = client(args).get(f"/v1/messages/{quote(args.message_id)}", topic=args.topic)
    messages = answer["messages"]
    emit(args, answer, lambda: "\n\n".join(render_message(m) for m in messages))


# What each trace event's line shows beside its name (halfmoon/broker/trace.py).
TRACE_FIELDS = (
    "topic", "queue_id", "queue_offset", "group", "attempt", "mode", "client", "invisible_ms",
    "attempts", "dead_letter_topic", "transaction_id", "producer_group", "check", "resolution",
    "source", "message_id", "to_topic", "broker",
)  # fmt: skip


def trace_message(args: argparse.Namespace) -> None:
    answer = client(args).get(f"/v1/messages/{quote(args.message_id)}/trace")

    def line(event: dict[str, Any]) -> str:
        facts = " ".join(
            f"{name}={event[name]}" for name in TRACE_FIELDS if event.get(name) is not None
        )
        return f"{format_ms(event['time_ms'])}  {event['event']:<17} {facts}".rstrip()

    emit(args, answer, lambda: "\n".join(line(e) for e in answer["events"]))


def consume_directly(args: argparse.Namespace) -> None:
    body = {"group": args.group, "client_id": args.client}
    if args.topic is not None:
        body["topic"] = args.topic
    answer = client(args).post(f"/v1/messages/{quote(args.message_id)}/consume", body)

    def human() -> str:
        verdict = "consumed it" if answer["consumed"] else f"did not consume it ({answer['code']})"
        detail = f": {answer['message']}" if answer.get("message") else ""
        return f"client {answer['client_id']} of group '{answer['group']}' {verdict}{detail}"

    emit(args, answer, human)


def query_messages(args: argparse.Namespace) -> None:
    _check_range(args)
    answer = client(args).get(
        f"/v1/topics/{quote(args.topic)}/messages",
        key=args.key,
        begin_ms=args.begin,
        end_ms=args.end,
        limit=args.limit,
    )
    messages = answer["messages"]
    emit(
        args,
        answer,
        lambda: (
            render_table(messages, QUERY_COLUMNS)
            if messages
            else f"no message with key '{args.key}' in '{args.topic}' in that time range"
        ),
    )


def read_message(args: argparse.Namespace) -> None:
    if args.queue < 0 or args.offset < 0:
        raise UsageError("--queue and --offset must be >= 0", "USAGE")
    message = client(args).get(
        f"/v1/topics/{quote(args.topic)}/queues/{args.queue}/offsets/{args.offset}"
    )
    emit(args, message, lambda: render_message(message))


def send_message(args: argparse.Namespace) -> None:
    payload = _read_body(args)
    body: dict[str, Any] = {"keys": args.keys, "properties": _properties(args.properties)}
    try:
        body["body"], body["body_encoding"] = payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body["body"], body["body_encoding"] = base64.b64encode(payload).decode(), "base64"
    if args.tag is not None:
        body["tag"] = args.tag
    if args.queue is not None:
        body["queue_id"] = args.queue
    if args.priority is not None:
        body["priority"] = args.priority
    if args.lite_topic is not None:
        body["lite_topic"] = args.lite_topic
    result = client(args).post(f"/v1/topics/{quote(args.topic)}/messages", body)
    emit(
        args,
        result,
        lambda: (
            f"sent message {result['message_id']} to '{result['topic']}' queue "
            f"{result['queue_id']} "
            f"offset {result['queue_offset']}"
        ),
    )


def _read_body(args: argparse.Namespace) -> bytes:
    if args.body is not None:
        payload = args.body.encode("utf-8")
    elif str(args.body_file) == "-":
        payload = sys.stdin.buffer.read()
    else:
        try:
            payload = args.body_file.read_bytes()
        except OSError as exc:
            raise CliError(
                f"cannot read the body file {args.body_file}: {exc.strerror}", "BAD_REQUEST"
            ) from None
    if not payload:
        raise UsageError("the message body is empty; send at least one byte", "USAGE")
    return payload


def _properties(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"bad --property {pair!r}: expected NAME=VALUE", "USAGE")
        out[name] = value
    return out


def scan_pages(
    api: AdminClient,
    args: argparse.Namespace,
    *,
    limit: int | None,
    bodies: bool = True,
    messages: bool = True,
    start_offset: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Each page of a scan, queue by queue, until ``limit`` messages (None: the whole range)."""
    topic = api.get(f"/v1/topics/{quote(args.topic)}/status")
    queues = [q["queue_id"] for q in topic["queues"]]
    if args.queue is not None:
        if args.queue not in queues:
            raise CliError(
                f"topic '{args.topic}' has no queue {args.queue} (0 to {len(queues) - 1})",
                "BAD_REQUEST",
            )
        queues = [args.queue]
    filter_type, expression = ("sql92", args.sql) if args.sql else ("tag", args.filter)
    left = limit
    for queue_id in queues:
        offset = start_offset
        while left is None or left > 0:
            page = api.get(
                f"/v1/topics/{quote(args.topic)}/scan",
                queue=queue_id,
                offset=offset,
                begin_ms=args.begin,
                end_ms=args.end,
                limit=min(PAGE, left or PAGE),
                filter_type=filter_type,
                filter=expression,
                bodies=str(bodies).lower(),
                messages=str(messages).lower(),
            )
            yield page
            if left is not None:
                left -= len(page["messages"])
            if page["complete"]:
                break
            offset = page["next_offsets"][str(queue_id)]


def consume_messages(args: argparse.Namespace) -> None:
    _check_range(args)
    if args.offset is not None and args.queue is None:
        raise UsageError("--offset needs --queue: offsets belong to one queue", "USAGE")
    if args.offset is not None and args.offset < 0:
        raise UsageError("--offset must be >= 0", "USAGE")
    api = client(args)
    found: list[dict[str, Any]] = []
    with ProgressBar(args.count if args.count > PAGE else None, "reading") as bar:
        for page in scan_pages(api, args, limit=args.count, start_offset=args.offset):
            found.extend(page["messages"])
            bar.update(len(found))
    found = found[: args.count]
    emit(
        args,
        {"messages": found},
        lambda: "\n".join(one_line(m) for m in found) if found else "no messages in that range",
    )


def print_messages(args: argparse.Namespace) -> None:
    _check_range(args)
    api = client(args)
    found: list[dict[str, Any]] = []
    tag_counts: dict[str, int] = {}
    matched = 0
    with ProgressBar(None, "scanning") as bar:
        for page in scan_pages(
            api, args, limit=None, bodies=args.bodies, messages=not args.tag_counts
        ):
            found.extend(page["messages"])
            matched += page["matched"]
            for tag, count in page["tag_counts"].items():
                tag_counts[tag] = tag_counts.get(tag, 0) + count
            bar.update(matched)
    tags = [
        {"tag": tag, "count": count}
        for tag, count in sorted(tag_counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    if args.tag_counts:
        emit(
            args,
            {"topic": args.topic, "matched": matched, "tags": tags},
            lambda: (
                (render_table(tags, [("tag", "TAG"), ("count", "COUNT")]) + f"\n\ntotal: {matched}")
                if tags
                else "no messages in that range"
            ),
        )
        return
    emit(
        args,
        {"messages": found, "matched": matched},
        lambda: (
            "\n".join([*(one_line(m) for m in found), f"\ntotal: {matched}"])
            if found
            else "no messages in that range"
        ),
    )
