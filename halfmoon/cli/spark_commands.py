"""``halfmoon spark audit`` and ``halfmoon spark stats``: the Spark jobs from the command line.

Both run on a local Spark (``local[*]``) unless ``--master`` names a cluster;
pyspark is imported only when one of them runs (it is the optional ``spark``
extra). ``audit`` exits 1 when the table and the topic disagree, so it can
gate a deployment or page someone from cron.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from halfmoon.cli.admin_client import CliError
from halfmoon.cli.parser import positive_int, subject
from halfmoon.errors import HalfmoonError

EXIT_INCONSISTENT = 1


def register(commands: argparse._SubParsersAction) -> None:
    spark = commands.add_parser(
        "spark",
        help="data pipeline jobs on Spark (audit, stats)",
        description="data pipeline jobs on Spark",
    )
    jobs = spark.add_subparsers(dest="spark_command", metavar="JOB", required=True)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--endpoint",
        default="127.0.0.1:8081",
        help="halfmoon gRPC endpoint HOST:PORT (default 127.0.0.1:8081)",
    )
    common.add_argument("--master", default=None, help="Spark master URL (default local[*])")
    common.add_argument("--json", action="store_true", help="print JSON for scripts")

    audit = jobs.add_parser(
        "audit",
        parents=[common],
        help="reconcile a database table with a topic's committed messages",
    )
    audit.add_argument(
        "--database",
        required=True,
        metavar="URL",
        help="SQLAlchemy URL of the database (sqlite:///app.db, postgresql+psycopg://...)",
    )
    audit.add_argument(
        "--table", required=True, help="the table holding one row per message that should exist"
    )
    audit.add_argument(
        "--key-column", required=True, help="the column whose value is the message key"
    )
    subject(
        audit, "topic", "TOPIC", "the topic the rows were published to", deprecated_flag="--topic"
    )
    audit.add_argument(
        "--primary-key",
        default=None,
        help="integer column to split the table read by (default: the key column)",
    )
    audit.add_argument(
        "--key-property",
        default=None,
        help="match on this message user property instead of the message's first key",
    )
    audit.add_argument("--where", default=None, help="only rows matching this SQL condition")
    audit.add_argument(
        "--partitions", type=positive_int, default=4, help="parallel reads of the table (default 4)"
    )
    audit.set_defaults(handler=run_audit_command)

    stats = jobs.add_parser(
        "stats", parents=[common], help="messages in/out per topic and group over time windows"
    )
    subject(stats, "topic", "TOPIC", "topics to count", nargs="+", deprecated_flag="--topic")
    stats.add_argument(
        "--group",
        action="append",
        default=[],
        help="consumer group whose consumption to count (repeatable)",
    )
    stats.add_argument(
        "--window", default="1 minute", help="window length, Spark syntax (default '1 minute')"
    )
    stats.add_argument(
        "--since",
        type=positive_int,
        default=None,
        metavar="MINUTES",
        help="only messages stored in the last MINUTES",
    )
    stats.set_defaults(handler=run_stats_command)


def _session(args: argparse.Namespace, name: str):  # type: ignore[no-untyped-def]
    # Here, not at the top: the spark extra is optional; without it this import raises
    # MissingExtra, one line naming the extra and how to install it.
    from halfmoon.spark import build_session

    spark = build_session(name, args.master)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_audit_command(args: argparse.Namespace) -> int:
    spark = _session(args, "halfmoon-audit")
    from halfmoon.spark.jobs.audit import AuditSpec, run_audit  # here: pyspark is optional

    spec = AuditSpec(
        database_url=args.database,
        table=args.table,
        key_column=args.key_column,
        endpoint=args.endpoint,
        topic=args.topic,
        primary_key=args.primary_key,
        key_property=args.key_property,
        partitions=args.partitions,
        where=args.where,
    )
    try:
        report = run_audit(spark, spec)
    except HalfmoonError as exc:
        raise CliError.of(exc) from None
    finally:
        spark.stop()
    if args.json:
        json.dump(report.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(report.text())
    return 0 if report.consistent else EXIT_INCONSISTENT


def run_stats_command(args: argparse.Namespace) -> int:
    spark = _session(args, "halfmoon-stats")
    from halfmoon.spark.jobs.stats import StatsSpec, run_stats  # here: pyspark is optional

    since = int(time.time() * 1000) - args.since * 60_000 if args.since else None
    spec = StatsSpec(args.endpoint, tuple(args.topic), tuple(args.group), args.window, since)
    try:
        rows = [r.asDict() for r in run_stats(spark, spec).collect()]
    except HalfmoonError as exc:
        raise CliError.of(exc) from None
    finally:
        spark.stop()
    for row in rows:
        row["window_start"], row["window_end"] = str(row["window_start"]), str(row["window_end"])
    if args.json:
        json.dump({"rows": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{'WINDOW START':<20} {'TOPIC':<24} {'GROUP (- = in)':<24} MESSAGES")
    for row in rows:
        print(
            f"{row['window_start'][:19]:<20} {row['topic']:<24} {row['group']:<24} "
            f"{row['messages']}"
        )
    return 0
