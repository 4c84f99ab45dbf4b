"""``halfmoon stats``: messages in per topic and out per group, per second and over 24 hours.

RocketMQ's statsAll: one row per topic (messages stored into it) and one per
(topic, group) (messages delivered to the group), with the group's lag. The
broker keeps minute buckets for 24 hours; rates are over the last 60 seconds.
"""

from __future__ import annotations

import argparse

from halfmoon.cli.parser import add_command, client, emit
from halfmoon.cli.table import render_table

STATS_COLUMNS = [
    ("topic", "TOPIC"),
    ("group", "GROUP"),
    ("direction", "DIRECTION"),
    ("per_second", "PER SECOND"),
    ("total_1h", "LAST HOUR"),
    ("total_24h", "LAST 24H"),
    ("lag", "LAG"),
]


def register(commands: argparse._SubParsersAction) -> None:
    stats = add_command(
        commands,
        "stats",
        show_stats,
        "messages in/out per second and over 24 h, per topic and group",
    )
    stats.add_argument("--topic", default=None, help="only this topic")
    stats.add_argument("--group", default=None, help="only this consumer group (its out rows)")


def show_stats(args: argparse.Namespace) -> None:
    answer = client(args).get("/v1/statistics", topic=args.topic, group=args.group)
    rows = answer["rows"]

    def human() -> str:
        if not rows:
            return "no traffic in the last 24 hours"
        total_in = sum(r["total_24h"] for r in rows if r["direction"] == "in")
        total_out = sum(r["total_24h"] for r in rows if r["direction"] == "out")
        return f"{render_table(rows, STATS_COLUMNS)}\n\nlast 24h: {total_in} in, {total_out} out"

    emit(args, answer, human)
