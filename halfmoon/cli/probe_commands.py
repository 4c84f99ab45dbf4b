"""``halfmoon probe send``: send N messages of S bytes through gRPC and report round trips.

RocketMQ's clusterRT / checkMsgSendRT / sendMsgStatus in one command. Each
send is timed from the call to the stored answer (``SendMessage``, one
attempt, no retries: a failure counts as a failure, not as a slow success),
with ``--concurrency`` senders in parallel. The gRPC address is ``--grpc``,
else ``$HALFMOON_GRPC``, else what the admin API says the broker listens on.

Only this command loads the gRPC client (``halfmoon.client``), and only when
it runs: the rest of the command line stays quick to start.
"""

from __future__ import annotations

import argparse
import itertools
import re
import time
from typing import Any

from halfmoon import environment
from halfmoon.cli.admin_client import CliError
from halfmoon.cli.parser import add_command, client, emit, positive_int, subject
from halfmoon.cli.progress import ProgressBar
from halfmoon.cli.table import render_record
from halfmoon.cli.timearg import duration

GRPC_ENV = environment.GRPC.name
MAX_PROBE_SIZE = 4 * 1024 * 1024
PERCENTILES = (50, 90, 99, 99.9)
_SIZE = re.compile(r"^\s*(\d+)\s*(b|k|kib|kb|m|mib|mb)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    None: 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mib": 1024**2,
    "mb": 1000**2,
}


def register(commands: argparse._SubParsersAction) -> None:
    probe = commands.add_parser("probe", help="measure send round trips through the gRPC endpoint")
    sub = probe.add_subparsers(dest="probe_command", metavar="ACTION", required=True)
    send = add_command(
        sub,
        "send",
        probe_send,
        "send N messages of size S; report round-trip percentiles. The messages are real: "
        "they are stored in TOPIC and its consumers receive them (tag 'probe' by default, "
        "so a consumer can filter them out)",
    )
    subject(
        send,
        "topic",
        "TOPIC",
        "an existing topic that accepts normal messages",
        deprecated_flag="--topic",
    )
    send.add_argument(
        "--count", type=positive_int, default=100, help="messages to send (default 100)"
    )
    send.add_argument(
        "--size", type=parse_size, default=1024, help="body size: 512, 1KiB, 1MiB (default 1KiB)"
    )
    send.add_argument(
        "--concurrency", type=positive_int, default=1, help="senders in parallel (default 1)"
    )
    send.add_argument(
        "--timeout",
        type=duration,
        default=3.0,
        help="how long to wait for each send: 500ms, 3s, a bare number is seconds (default 3s)",
    )
    send.add_argument("--tag", default="probe", help="tag of the probe messages (default probe)")
    send.add_argument(
        "--grpc",
        default=None,
        metavar="HOST:PORT",
        help=f"gRPC address (default: ${GRPC_ENV}, else the broker's address from the admin API)",
    )


def parse_size(text: str) -> int:
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: expected e.g. 512, 64KiB or 1MiB")
    size = int(match.group(1)) * _SIZE_UNITS[match.group(2).lower() if match.group(2) else None]
    if not 1 <= size <= MAX_PROBE_SIZE:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: must be 1 byte to 4 MiB")
    return size


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest rank: the smallest value with at least ``pct`` percent of values at or below it."""
    if not sorted_values:
        return 0.0
    rank = max(1, -(-len(sorted_values) * pct // 100))
    return sorted_values[min(len(sorted_values), int(rank)) - 1]


def summarize(
    latencies_ms: list[float], failures: int, elapsed_s: float, size: int
) -> dict[str, Any]:
    ordered = sorted(latencies_ms)
    sent = len(ordered)
    report: dict[str, Any] = {
        "sent": sent,
        "failed": failures,
        "size": size,
        "elapsed_s": round(elapsed_s, 3),
        "throughput_per_s": round(sent / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        "rt_min": round(ordered[0], 3) if ordered else None,
        "rt_avg": round(sum(ordered) / sent, 3) if sent else None,
    }
    for pct in PERCENTILES:
        report[f"rt_p{pct:g}".replace(".", "_")] = (
            round(percentile(ordered, pct), 3) if ordered else None
        )
    report["rt_max"] = round(ordered[-1], 3) if ordered else None
    return report


def grpc_address(args: argparse.Namespace) -> str:
    if args.grpc:
        return args.grpc
    named = environment.GRPC.get()
    if named:
        return named
    brokers = client(args).get("/v1/cluster")["brokers"]
    if not brokers:
        raise CliError(
            f"the admin API knows no broker; pass --grpc HOST:PORT or set {GRPC_ENV}", "UNAVAILABLE"
        )
    return str(brokers[0]["grpc"])


async def run_probe(
    address: str, args: argparse.Namespace, bar: ProgressBar
) -> tuple[list[float], list[str], float]:
    # Imported here, not at the top: asyncio and the gRPC client are slow to
    # load, and only this command needs them.
    import asyncio

    from halfmoon.client import ClientError, Message, Producer

    latencies: list[float] = []
    errors: list[str] = []
    body = (b"halfmoon-probe-" * (args.size // 15 + 1))[: args.size]
    numbers = itertools.count()

    async def sender(producer: Producer) -> None:
        while (n := next(numbers)) < args.count:
            message = Message(args.topic, body, tag=args.tag, keys=[f"probe-{n}"])
            started = time.perf_counter()
            try:
                await producer.send(message, timeout=args.timeout)
            except (TimeoutError, ClientError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            else:
                latencies.append((time.perf_counter() - started) * 1000)
            bar.update(len(latencies) + len(errors))

    try:
        async with Producer(
            address,
            topics=[args.topic],
            max_attempts=1,
            request_timeout=args.timeout,
            namespace=client(args).namespace,
        ) as producer:
            started = time.perf_counter()
            await asyncio.gather(
                *(sender(producer) for _ in range(min(args.concurrency, args.count)))
            )
            elapsed = time.perf_counter() - started
    except ClientError as exc:
        raise CliError(
            f"cannot probe '{args.topic}' at {address}: {exc}", getattr(exc, "code", None)
        ) from None
    return latencies, errors, elapsed


def probe_send(args: argparse.Namespace) -> None:
    address = grpc_address(args)
    import asyncio  # here, not at the top: the rest of the CLI starts faster without it

    with ProgressBar(args.count, f"probing {address}") as bar:
        latencies, errors, elapsed = asyncio.run(run_probe(address, args, bar))
    report = {
        "topic": args.topic,
        "address": address,
        "concurrency": args.concurrency,
        **summarize(latencies, len(errors), elapsed, args.size),
    }

    def human() -> str:
        shown = {
            k: (f"{v:.2f} ms" if k.startswith("rt_") and v is not None else v)
            for k, v in report.items()
        }
        shown["elapsed_s"] = f"{report['elapsed_s']:.2f} s"
        shown["size"] = f"{args.size} B"
        shown["throughput_per_s"] = f"{report['throughput_per_s']:.1f} messages/s"
        named = {"elapsed_s": "elapsed", "throughput_per_s": "throughput"}
        labels = [
            (
                k,
                named.get(k)
                or (
                    k.replace("rt_", "rt ").replace("_", ".")
                    if k.startswith("rt_p")
                    else k.replace("_", " ")
                ),
            )
            for k in report
        ]
        return render_record(shown, labels)

    emit(args, report, human)
    if errors:
        raise CliError(
            f"{len(errors)} of {args.count} sends failed; first: {errors[0]}", "SEND_FAILED"
        )
