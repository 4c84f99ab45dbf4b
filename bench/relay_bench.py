"""Outbox relay throughput and commit-to-publish latency, PostgreSQL → halfmoon and → RabbitMQ.

    .venv/bin/python -m bench.relay_bench                 # ~1-2 minutes
    .venv/bin/python -m bench.relay_bench --messages 5000 # quicker

For each target (a real ``halfmoon serve`` subprocess, async flush; RabbitMQ
at ``HALFMOON_TEST_AMQP``), in the same run:

- **relay, 1 and 4 workers**: 4 workers as threads of this process, as
  2 processes x 2 threads and as 4 processes x 1 (``RelayProcesses``, what
  ``halfmoon outbox relay --processes N`` runs). The relay starts idle on an
  empty outbox; ``--messages`` rows over ``--aggregates`` aggregates then
  arrive in one transaction, and the clock runs from its commit until the
  relay has published them all;
- **target ceiling**: the same messages published by 4 threads straight to
  the target, no database: what the relay could reach if claiming and
  marking were free;
- **naive loop**: the pattern most hand-written relays start as — select
  pending rows, publish each one, update it, commit — one worker;
- **latency**: rows inserted one per transaction at ``--rate`` per second
  with the relay idle (1 worker, 1 s poll, so only NOTIFY can explain a fast
  answer); insert-to-published time per message (p50, p99).

Targets: ≥ 10,000 messages/s with 4 workers; latency p50 ≤ 20 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

from sqlalchemy import select, update

from bench.amqp_peer import amqp_url
from bench.server_proc import HalfmoonServer
from halfmoon.outbox import (
    HalfmoonTarget,
    Outbox,
    OutboxMessage,
    OutboxRecord,
    PublishTarget,
    RabbitTarget,
    Relay,
)
from halfmoon.outbox.outbox import now_ms
from halfmoon.outbox.relay import RelayProcesses
from halfmoon.outbox.targets import target_for_url

POSTGRES = os.environ.get(
    "HALFMOON_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
TOPIC = "RelayBench"
# (processes, worker threads each); 0 processes: threads in the benchmark's process.
SHAPES = ((0, 1), (0, 4), (2, 2), (4, 1))


def fill(
    outbox: Outbox,
    topic: str,
    count: int,
    aggregates: int,
    routing_key: str = "",
    chunk: int = 2000,
) -> None:
    """``count`` rows over ``aggregates`` aggregates, ``chunk`` rows per transaction."""
    body = b"x" * 256
    for start in range(0, count, chunk):
        with outbox.engine.begin() as conn:
            outbox.add_many(
                conn,
                [
                    OutboxMessage(
                        topic,
                        body,
                        routing_key=routing_key,
                        aggregate_type="bench",
                        aggregate_id=str(i % aggregates),
                    )
                    for i in range(start, min(start + chunk, count))
                ],
            )


def reset(outbox: Outbox) -> None:
    with outbox.engine.begin() as conn:
        conn.execute(outbox.table.delete())


def run_relay(
    outbox: Outbox,
    target_url: str,
    topic: str,
    count: int,
    aggregates: int,
    processes: int,
    workers: int,
    batch: int,
    routing_key: str = "",
) -> float:
    """Throughput with ``processes`` x ``workers`` (0 processes: threads in this process).

    The relay starts on an empty outbox and idles; the rows then arrive in one
    transaction, and the clock runs from its commit until the relay has published
    every row (a counter, not a query: polling the table would load PostgreSQL).
    """
    options = {
        "workers": workers,
        "batch_size": batch,
        "poll_interval": 0.02,
        "sent_retention": None,
        "listen": False,
    }
    if processes:
        group: Relay | RelayProcesses = RelayProcesses(
            POSTGRES, target_url, processes=processes, table_prefix=outbox.tables.prefix, **options
        )
    else:
        group = Relay(outbox, target_for_url(target_url), **options)  # type: ignore[arg-type]
    group.start()
    try:
        fill(outbox, topic, count, aggregates, routing_key, chunk=count)
        started = time.perf_counter()
        while group.published < count:
            time.sleep(0.005)
        elapsed = time.perf_counter() - started
    finally:
        group.stop()
    return count / elapsed


def run_publish_only(
    make: Callable[[], PublishTarget],
    topic: str,
    count: int,
    batch: int,
    threads: int,
    routing_key: str = "",
) -> float:
    """The target's own ceiling: ``threads`` threads publishing batches with no database at all."""
    import threading

    target = make()
    target.start()
    body = b"x" * 256
    per_thread = count // threads
    records = [
        [
            OutboxRecord(
                t * per_thread + i,
                uuid.uuid4().hex,
                "bench",
                str(i),
                topic,
                routing_key,
                [],
                None,
                None,
                {},
                body,
                0,
                0,
            )
            for i in range(per_thread)
        ]
        for t in range(threads)
    ]
    failures = []

    def publish(mine: list[OutboxRecord]) -> None:
        for start in range(0, len(mine), batch):
            failures.extend(r for r in target.publish(mine[start : start + batch]) if r is not None)

    workers = [threading.Thread(target=publish, args=(mine,)) for mine in records]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    target.close()
    if failures:
        raise RuntimeError(f"publish-only run failed: {failures[0]!r}")
    return per_thread * threads / elapsed


def run_naive(outbox: Outbox, target: PublishTarget, count: int) -> float:
    """SELECT pending LIMIT 100; for each: publish, UPDATE sent; COMMIT."""
    t = outbox.table
    target.start()
    published = 0
    started = time.perf_counter()
    while published < count:
        with outbox.engine.begin() as conn:
            rows = conn.execute(
                select(t).where(t.c.status == "pending").order_by(t.c.id).limit(100)
            ).all()
            for row in rows:
                (error,) = target.publish([OutboxRecord.from_row(row)])
                if error is None:
                    conn.execute(
                        update(t).where(t.c.id == row.id).values(status="sent", sent_at=now_ms())
                    )
                    published += 1
    elapsed = time.perf_counter() - started
    target.close()
    return count / elapsed


def run_latency(
    outbox: Outbox,
    target: PublishTarget,
    topic: str,
    count: int,
    rate: float,
    routing_key: str = "",
) -> tuple[float, float]:
    relay = Relay(outbox, target, workers=1, poll_interval=1.0, sent_retention=None)
    relay.start()
    relay.wait_listening(10)
    interval = 1.0 / rate
    next_at = time.perf_counter()
    for i in range(count):
        with outbox.engine.begin() as conn:
            outbox.add(
                conn,
                OutboxMessage(topic, b"latency", routing_key=routing_key, aggregate_id=f"l{i}"),
            )
        next_at += interval
        time.sleep(max(next_at - time.perf_counter(), 0))  # pacing the producer, not synchronising
    while relay.stats().published < count:
        time.sleep(0.02)
    stats = relay.stats()
    relay.stop()
    return stats.delivery_latency_p50 * 1000, stats.delivery_latency_p99 * 1000


def declare_queue(url: str, name: str, delete: bool = False) -> None:
    import aio_pika

    async def go() -> None:
        connection = await aio_pika.connect(url)
        async with connection:
            channel = await connection.channel()
            if delete:
                await channel.queue_delete(name)
            else:
                queue = await channel.declare_queue(name, durable=True)
                await queue.purge()

    asyncio.run(go())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--aggregates", type=int, default=10000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--naive-messages", type=int, default=3000)
    parser.add_argument("--latency-count", type=int, default=300)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--targets", default="halfmoon,rabbitmq")
    parser.add_argument(
        "--shapes",
        default=",".join(f"{p}x{w}" for p, w in SHAPES),
        help="PROCESSESxTHREADS list; 0 processes: threads in this process",
    )
    parser.add_argument("--no-naive", action="store_true")
    parser.add_argument("--no-latency", action="store_true")
    args = parser.parse_args(argv)
    shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]

    outbox = Outbox(POSTGRES, table_prefix=f"bench{uuid.uuid4().hex[:6]}_")
    outbox.create_tables()
    rows: list[tuple[str, str, str]] = []

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def scenarios(
        name: str, make: Callable[[], PublishTarget], url: str, topic: str, routing_key: str
    ) -> None:
        for processes, workers in shapes:
            reset(outbox)
            rate = run_relay(
                outbox,
                url,
                topic,
                args.messages,
                args.aggregates,
                processes,
                workers,
                args.batch,
                routing_key,
            )
            shape = (
                f"{workers} thread{'s' if workers > 1 else ''}"
                if not processes
                else f"{processes} processes x {workers} thread{'s' if workers > 1 else ''}"
            )
            rows.append(
                (
                    name,
                    f"relay, {max(processes, 1) * workers} "
                    f"worker{'s' if max(processes, 1) * workers > 1 else ''} ({shape})",
                    f"{rate:,.0f} msgs/s",
                )
            )
            log(f"{name} relay {shape}: {rate:,.0f}/s")
        rate = run_publish_only(make, topic, args.messages, args.batch, 4, routing_key)
        rows.append(
            (name, "target ceiling: publish only, no database (4 threads)", f"{rate:,.0f} msgs/s")
        )
        log(f"{name} publish only: {rate:,.0f}/s")
        if args.no_naive:
            return
        reset(outbox)
        fill(outbox, topic, args.naive_messages, args.aggregates, routing_key)
        rate = run_naive(outbox, make(), args.naive_messages)
        rows.append((name, "naive select-publish-update loop", f"{rate:,.0f} msgs/s"))
        log(f"{name} naive: {rate:,.0f}/s")
        if args.no_latency:
            return
        reset(outbox)
        p50, p99 = run_latency(outbox, make(), topic, args.latency_count, args.rate, routing_key)
        rows.append(
            (
                name,
                f"insert-to-publish latency with NOTIFY ({args.rate:.0f}/s)",
                f"p50 {p50:.1f} ms, p99 {p99:.1f} ms",
            )
        )
        log(f"{name} latency: p50 {p50:.1f} ms p99 {p99:.1f} ms")

    try:
        if "halfmoon" in args.targets:
            with HalfmoonServer(flush="async") as server:
                server.create_topic(TOPIC, queues=8)
                url = f"halfmoon://{server.grpc}"
                scenarios("halfmoon", lambda: HalfmoonTarget(url), url, TOPIC, "")
        if "rabbitmq" in args.targets:
            queue = f"relay-bench-{uuid.uuid4().hex[:6]}"
            declare_queue(amqp_url(), queue)
            try:
                scenarios("rabbitmq", lambda: RabbitTarget(amqp_url()), amqp_url(), "", queue)
            finally:
                declare_queue(amqp_url(), queue, delete=True)
    finally:
        outbox.drop_tables()

    tree = subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip()
    print(
        f"outbox relay benchmark — PostgreSQL, {args.messages} messages over {args.aggregates} "
        f"aggregates, batch {args.batch}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, tree {tree}"
    )
    width = max(len(r[1]) for r in rows)
    print(f"{'target':<10} {'scenario':<{width}}  result")
    for target, scenario, result in rows:
        print(f"{target:<10} {scenario:<{width}}  {result}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
