"""``halfmoon outbox relay|status|parked|replay``: run the outbox relay, inspect an
outbox table, list the failed (parked) messages and put them back to pending.

    halfmoon outbox relay --db postgresql+psycopg://app@db/app \\
        --target halfmoon://127.0.0.1:8081 --workers 2 --processes 2 --batch 500 --poll 500ms
    halfmoon outbox status --db sqlite:///app.db
    halfmoon outbox parked --db sqlite:///app.db
    halfmoon outbox replay ID --db sqlite:///app.db

``relay`` runs until SIGTERM/SIGINT, then finishes the batches in flight.
``--processes N`` runs N child processes of ``--workers`` threads each (one
GIL per process, so the workers use every core) and restarts a child that
dies. Run as many relay commands as you like, too: they share the work and
keep each aggregate's order.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from halfmoon.cli.admin_client import CliError
from halfmoon.cli.parser import add_command, emit, positive_int
from halfmoon.cli.timearg import duration
from halfmoon.errors import HalfmoonError


def register(commands: argparse._SubParsersAction) -> None:
    outbox = commands.add_parser(
        "outbox", help="run the transactional outbox relay; show an outbox's state"
    )
    sub = outbox.add_subparsers(dest="outbox_command", metavar="ACTION", required=True)

    relay = add_command(
        sub, "relay", run_relay, "publish outbox rows to halfmoon or RabbitMQ", admin=False
    )
    relay.add_argument(
        "--db",
        required=True,
        metavar="URL",
        help="SQLAlchemy URL of the database holding the outbox",
    )
    relay.add_argument(
        "--target",
        required=True,
        metavar="URL",
        help="halfmoon://HOST:PORT or amqp://USER:PASS@HOST:PORT/VHOST",
    )
    relay.add_argument(
        "--workers", type=positive_int, default=4, help="worker threads per process (default 4)"
    )
    relay.add_argument(
        "--processes",
        type=positive_int,
        default=1,
        help="relay processes (default 1: the workers run in this process)",
    )
    relay.add_argument(
        "--batch", type=positive_int, default=100, help="rows claimed per batch (default 100)"
    )
    relay.add_argument(
        "--poll",
        type=duration,
        default=0.5,
        help="idle polling interval (default 500ms; NOTIFY wakes sooner on PostgreSQL)",
    )
    relay.add_argument(
        "--max-attempts",
        type=positive_int,
        default=10,
        help="publish attempts before a message is marked failed (default 10)",
    )
    relay.add_argument(
        "--table-prefix", default="hm_", help="prefix of the outbox tables (default hm_)"
    )
    relay.add_argument(
        "--create-tables", action="store_true", help="create the outbox tables if they are missing"
    )
    relay.add_argument(
        "--no-failed-block",
        action="store_true",
        help="let an aggregate's later messages pass one marked failed",
    )
    relay.add_argument("--log-level", default="INFO", help="log level (default INFO)")

    status = add_command(
        sub, "status", show_status, "pending, sent and failed counts and the oldest pending age"
    )
    status.add_argument("--db", required=True, metavar="URL")
    status.add_argument("--table-prefix", default="hm_")

    parked = add_command(
        sub,
        "parked",
        show_parked,
        "failed messages (a permanent error parks one at once), with why",
    )
    parked.add_argument("--db", required=True, metavar="URL")
    parked.add_argument("--table-prefix", default="hm_")
    parked.add_argument(
        "--limit", type=positive_int, default=100, help="at most this many (default 100)"
    )

    replay = add_command(
        sub, "replay", replay_parked, "put failed messages back to pending, to publish again"
    )
    replay.add_argument("message_ids", nargs="*", metavar="ID", help="outbox message ids")
    replay.add_argument("--all", action="store_true", help="every failed message")
    replay.add_argument("--db", required=True, metavar="URL")
    replay.add_argument("--table-prefix", default="hm_")


def _open_outbox(url: str, prefix: str, pool_size: int = 5) -> Any:
    # Imported here, as below: the outbox needs sqlalchemy (the optional db extra), which
    # is slow to load; the rest of the CLI must start without it.
    from halfmoon.outbox.dialects import make_engine
    from halfmoon.outbox.outbox import Outbox

    try:
        return Outbox(make_engine(url, pool_size=pool_size), table_prefix=prefix)
    except Exception as exc:  # noqa: BLE001 — bad URL or missing driver: one line
        raise CliError(f"cannot open database {url!r}: {exc}", "OUTBOX_BAD_DATABASE") from None


def run_relay(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if args.processes > 1:
        return _run_relay_processes(args)
    from halfmoon.outbox.relay import Relay  # here: see _open_outbox
    from halfmoon.outbox.targets import target_for_url

    outbox = _open_outbox(args.db, args.table_prefix, pool_size=args.workers + 2)
    try:
        if args.create_tables:
            outbox.create_tables()
        target = target_for_url(args.target)
        relay = Relay(outbox, target, **_relay_options(args))
        stop = _stop_on_signals()
        relay.start()
    except HalfmoonError as exc:
        raise CliError.of(exc) from None
    print(
        f"outbox relay running: workers={args.workers} batch={args.batch} target={target.name}",
        flush=True,
    )
    stop.wait()
    relay.stop()
    stats = relay.stats()
    print(
        f"outbox relay stopped: published={stats.published} failed={stats.failed} "
        f"pending={stats.pending}",
        flush=True,
    )
    return 0


def _relay_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "workers": args.workers,
        "batch_size": args.batch,
        "poll_interval": args.poll,
        "max_attempts": args.max_attempts,
        "failed_blocks_aggregate": not args.no_failed_block,
    }


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def _run_relay_processes(args: argparse.Namespace) -> int:
    from halfmoon.outbox.relay_processes import RelayProcesses  # here: see _open_outbox
    from halfmoon.outbox.targets import target_for_url

    outbox = _open_outbox(args.db, args.table_prefix)
    try:
        target_for_url(args.target)  # a bad URL fails here, once, not in every child
        if args.create_tables:
            outbox.create_tables()
        outbox.engine.dispose()  # the children open their own connections
        group = RelayProcesses(
            args.db,
            args.target,
            processes=args.processes,
            table_prefix=args.table_prefix,
            **_relay_options(args),
        )
        stop = _stop_on_signals()
        group.start()
    except HalfmoonError as exc:
        raise CliError.of(exc) from None
    except RuntimeError as exc:
        raise CliError(f"{exc}; see the log above", "OUTBOX_RELAY_START_FAILED") from None
    print(
        f"outbox relay running: processes={args.processes} workers={args.workers} "
        f"batch={args.batch} target={args.target.split('://')[0]}",
        flush=True,
    )
    group.supervise(stop)
    group.stop()
    print(
        f"outbox relay stopped: published={group.published} restarts={group.restarts} "
        f"pending={outbox.status().pending}",
        flush=True,
    )
    return 0


def show_status(args: argparse.Namespace) -> int:
    outbox = _open_outbox(args.db, args.table_prefix)
    try:
        status = outbox.status()
    except Exception as exc:  # noqa: BLE001
        cause = " ".join(str(getattr(exc, "orig", exc)).split())[:300]
        raise CliError(
            f"cannot read the outbox table {outbox.table.name!r} ({cause}); check --db and "
            "--table-prefix, or create it with 'outbox relay --create-tables'",
            "OUTBOX_UNREADABLE",
        ) from None
    data = {
        "pending": status.pending,
        "sent": status.sent,
        "failed": status.failed,
        "oldest_pending_age_seconds": round(status.oldest_pending_age, 3),
    }
    emit(args, data, lambda: "\n".join(f"{k:<28}{v}" for k, v in data.items()))
    return 0


def _unreadable(outbox: Any, exc: Exception) -> CliError:
    cause = " ".join(str(getattr(exc, "orig", exc)).split())[:300]
    return CliError(
        f"cannot read the outbox table {outbox.table.name!r} ({cause}); check --db and "
        "--table-prefix, or create it with 'outbox relay --create-tables'",
        "OUTBOX_UNREADABLE",
    )


def show_parked(args: argparse.Namespace) -> int:
    outbox = _open_outbox(args.db, args.table_prefix)
    try:
        rows = outbox.failed_messages(args.limit)
    except Exception as exc:  # noqa: BLE001
        raise _unreadable(outbox, exc) from None
    data = {"messages": rows}

    def human() -> str:
        if not rows:
            return "no failed messages"
        return "\n".join(
            f"{row['message_id']}  {row['aggregate_type']}/{row['aggregate_id']}  "
            f"topic={row['topic']}  attempts={row['attempts']}  {row['last_error']}"
            for row in rows
        )

    emit(args, data, human)
    return 0


def replay_parked(args: argparse.Namespace) -> int:
    if bool(args.message_ids) == bool(args.all):
        raise CliError("name the IDs to replay, or pass --all", "USAGE")
    outbox = _open_outbox(args.db, args.table_prefix)
    try:
        count = outbox.retry_failed(None if args.all else args.message_ids)
    except Exception as exc:  # noqa: BLE001
        raise _unreadable(outbox, exc) from None
    data = {"replayed": count}
    emit(args, data, lambda: f"{count} message(s) back to pending")
    return 0
