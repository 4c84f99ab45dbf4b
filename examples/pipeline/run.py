"""Run the revenue pipeline end to end with one command.

    .venv/bin/python -m examples.pipeline.run            # its own halfmoon serve and local Spark
    .venv/bin/python -m examples.pipeline.run --endpoint 127.0.0.1:8081 --admin http://127.0.0.1:8082
    .venv/bin/python -m examples.pipeline.run --master spark://host:7077

It creates the topics, publishes order events over a few minutes of event
time (some of them late, some in transactions that roll back), runs the
pipeline (1-second triggers) until every minute has come out, stops it, then
checks that the topic and the Parquet output hold the same minutes and that
each minute's revenue is what the committed orders add up to. Exit 1 if not.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples.pipeline.revenue import revenue_per_minute, start_outputs  # noqa: E402
from halfmoon.client import Message, SyncProducer  # noqa: E402
from halfmoon.spark import build_session  # noqa: E402
from halfmoon.spark.sink import MARKER_TOPIC  # noqa: E402
from halfmoon.spark.wire import Wire  # noqa: E402

EXTRA: list[str] = []  # more --set flags for the demo's own server
IN_TOPIC, OUT_TOPIC = "order-events", "revenue-per-minute"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(data_dir: str) -> tuple[subprocess.Popen[str], str, str]:
    grpc, admin = f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"
    cmd = [
        sys.executable,
        "-m",
        "halfmoon",
        "serve",
        "--data-dir",
        data_dir,
        "--listen",
        grpc,
        "--admin-listen",
        admin,
        "--set",
        "store.segment_size=16MiB",
    ] + EXTRA
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    ready, lines = threading.Event(), []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "halfmoon ready" in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + 30
    while not ready.wait(0.1):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("halfmoon serve did not start:\n" + "".join(lines[-20:]))
    return proc, grpc, f"http://{admin}"


def create_topic(admin: str, name: str, message_type: str, queues: int) -> None:
    body = json.dumps(
        {"name": name, "message_type": message_type, "queue_count": queues, "perm": "rw"}
    ).encode()
    request = urllib.request.Request(
        f"{admin}/v1/topics", data=body, method="POST", headers={"content-type": "application/json"}
    )
    try:
        urllib.request.urlopen(request, timeout=10).read()
    except urllib.error.HTTPError as exc:
        if exc.code != 409:  # already there: fine
            raise


def publish(endpoint: str, seed: int) -> dict[str, float]:
    """Order events over 5 minutes of event time; returns the expected revenue per minute."""
    rng = random.Random(seed)
    start = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    expected: dict[str, float] = defaultdict(float)
    events, late = [], []
    for i in range(600):
        at = start + timedelta(seconds=i / 2)
        amount = round(rng.uniform(5, 120), 2)
        event = {
            "order_id": f"o-{i}",
            "kind": "order",
            "amount": amount,
            "event_time": at.isoformat(),
        }
        expected[at.strftime("%Y-%m-%dT%H:%M")] += amount
        (late if i % 50 == 0 else events).append(event)
    # Late events arrive 30 s (60 events) after their time, behind newer ones: under the
    # 2-minute watermark (with 100-event triggers), they still count.
    for event in late:
        index = next(i for i, e in enumerate(events) if e["event_time"] > event["event_time"])
        events.insert(min(index + 60, len(events)), event)
    # Far ahead in event time: moves the watermark past the last real minute so it is emitted.
    events.append(
        {
            "order_id": "tick",
            "kind": "tick",
            "amount": 0.0,
            "event_time": (start + timedelta(minutes=10)).isoformat(),
        }
    )
    with SyncProducer(endpoint) as producer:
        producer.send_batch(
            [Message(IN_TOPIC, json.dumps(e).encode(), keys=[e["order_id"]]) for e in events]
        )
    # Orders whose transaction rolled back never reach the topic's readers, so never count.
    wire = Wire(endpoint)
    ghosts = [
        Message(
            IN_TOPIC,
            json.dumps(
                {
                    "order_id": f"ghost-{i}",
                    "kind": "order",
                    "amount": 1e6,
                    "event_time": start.isoformat(),
                }
            ).encode(),
        )
        for i in range(5)
    ]
    wire.send_halves(ghosts, f"ghost-orders-{seed}-{time.time_ns()}")
    wire.end_group(ghosts[0].properties["__HM_TXN_GROUP"], IN_TOPIC, commit=False)
    return {minute: round(total, 2) for minute, total in expected.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--endpoint", help="a running halfmoon's gRPC HOST:PORT (default: start one)"
    )
    parser.add_argument("--admin", help="its admin URL (to create the topics)")
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    parser.add_argument(
        "--out",
        default=None,
        help="directory for Parquet output and checkpoints (default: temporary)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--timeout", type=float, default=180, help="seconds to wait for every minute to come out"
    )
    args = parser.parse_args(argv)

    scratch = tempfile.TemporaryDirectory(prefix="halfmoon-pipeline-")
    server = None
    endpoint, admin = args.endpoint, args.admin
    if endpoint is None:
        server, endpoint, admin = start_server(f"{scratch.name}/data")
    try:
        if admin:
            create_topic(admin, IN_TOPIC, "mixed", 4)
            create_topic(admin, OUT_TOPIC, "transaction", 2)
            create_topic(admin, MARKER_TOPIC, "transaction", 1)
        expected = publish(endpoint, args.seed)
        out = Path(args.out or scratch.name)
        spark = build_session("halfmoon-revenue", args.master)
        spark.sparkContext.setLogLevel("ERROR")
        queries = start_outputs(
            revenue_per_minute(spark, endpoint, IN_TOPIC),
            endpoint,
            OUT_TOPIC,
            str(out / "revenue.parquet"),
            str(out / "checkpoints"),
            available_now=False,
        )

        def outputs() -> tuple[dict[str, float], list]:
            # The file sink's own log says which files are committed; none yet: nothing to read.
            committed = any((out / "revenue.parquet" / "_spark_metadata").glob("[0-9]*"))
            rows = spark.read.parquet(str(out / "revenue.parquet")).collect() if committed else []
            parquet = {r.minute_start.strftime("%Y-%m-%dT%H:%M"): r.revenue for r in rows}
            messages = (
                spark.read.format("halfmoon")
                .option("endpoint", endpoint)
                .option("topic", OUT_TOPIC)
                .load()
                .collect()
            )
            return parquet, messages

        # A streaming pipeline runs until stopped: stop it once every minute came out (or at the
        # deadline).
        deadline = time.monotonic() + args.timeout
        parquet, messages = outputs()
        while (
            len(parquet) < len(expected) or len(messages) < len(expected)
        ) and time.monotonic() < deadline:
            if any(q.exception() is not None for q in queries):
                break
            queries[0].awaitTermination(2)
            parquet, messages = outputs()
        for query in queries:
            query.stop()
        topic = {r.keys[0]: json.loads(r.body)["revenue"] for r in messages}
        spark.stop()
    finally:
        if server is not None:
            server.terminate()
            server.wait(20)
        scratch.cleanup()
    print(f"{'MINUTE (UTC)':<18} {'EXPECTED':>10} {'PARQUET':>10} {'TOPIC':>10}")
    for minute in sorted(expected):
        print(
            f"{minute:<18} {expected[minute]:>10.2f} {parquet.get(minute, float('nan')):>10.2f} "
            f"{topic.get(minute, float('nan')):>10.2f}"
        )
    checks = {
        "each minute once in the topic": len(messages) == len(topic) == len(expected),
        "topic and Parquet agree": topic == parquet,
        "revenue = committed orders (late ones included, rolled-back ones not)": all(
            abs(parquet.get(m, -1) - v) < 0.01 for m, v in expected.items()
        ),
    }
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    print("CONSISTENT" if all(checks.values()) else "INCONSISTENT")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
