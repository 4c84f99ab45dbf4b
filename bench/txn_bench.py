"""The transactional messages benchmark: ``halfmoon serve`` over gRPC, three scenarios.

    python -m bench.txn_bench               # full run (100,000 orphans; about 3 minutes on 2 cores)
    python -m bench.txn_bench --quick       # a short run (2,000 orphans)
    python -m bench.txn_bench --seconds 0.3 --latency-count 20 --orphans 200 --json out.json

Every scenario runs against a real server on loopback, from this one Python
process (one clock), with 1 KiB bodies, once per flush mode: ``--flush
sync`` (an answer comes after fsync: the headline, since a transaction's
decision must be durable) and ``--flush async``.

1. **Transactional send + commit throughput** beside plain sends: 16
   concurrent producers on raw gRPC stubs; a plain round is one
   SendMessage of one NORMAL message; a transactional round is one
   SendMessage of one TRANSACTION message (the half message) then one
   EndTransaction COMMIT, counted when both are answered. Same request
   shape on both sides: one message per request, no coalescing. Plain and
   transactional turns alternate (``rounds``) so drift hits both alike.
2. **Commit-to-visible latency**: a half message is stored (untimed), then
   the clock starts as EndTransaction COMMIT is sent and stops when a
   long-polling consumer (ReceiveMessage) holds the message. One message in
   flight at a time. The EndTransaction round trip is reported beside it.
3. **Orphan resolution** (``orphan_flushes``, sync by default), beside its
   peer in the same run. Peer: ``orphans`` half messages planted with an
   hour's check immunity (never checked), then the project client's
   ``TransactionProducer`` answers each one itself as it answers a check
   (its listener, then EndTransaction COMMIT with source SERVER_CHECK,
   ``CHECK_WORKERS`` in flight): what the producer needs to answer that
   many checks. Orphans: ``orphans`` half messages sent in batches of
   ``ORPHAN_BATCH`` per SendMessageRequest with no producer live, never
   decided; once all are due (``transaction.timeout_ms`` = 1 s, scans every
   ``check_interval_ms`` = 2 s) the same kind of producer starts (a listener
   that answers every RecoverOrphanedTransactionCommand with COMMIT), and
   the time from its start until the topic holds every orphan is the
   resolution time. Printed: the ratio of the two times, and the server's
   CPU (from /proc) per resolved orphan and per answer. The scan's own
   report (``event=check_scan`` in the server log: candidates, sent,
   elapsed_ms) gives its cost.

Targets (issue 4): transactional ≥ 0.5 × plain throughput; commit-to-visible
p99 ≤ 5 ms; (issue 15) orphans resolved in ≤ 1.2 × the time the producer
needs to answer as many checks. ``--orphans-only`` runs scenario 3 alone.
Analysis: docs/benchmarks.md, "Transactional messages".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict
from typing import TextIO

from bench.load import (
    BODY_SIZE,
    Arrivals,
    Throughput,
    body,
    machine_info,
    seq_of,
    timed_producers,
)
from bench.server_proc import Flush, HalfmoonServer
from bench.txn_common import (
    CHECK_WORKERS,
    FULL,
    LATENCY_WARMUP,
    ORPHAN_BATCH,
    ORPHAN_RATIO_GOAL,
    PRODUCERS,
    QUICK,
    TXN_RATIO_GOAL,
    VISIBLE_P99_MS,
    Log,
    RawClient,
    Report,
    Result,
    Settings,
    Target,
    fresh_topic,
    names,
    pending_count,
)
from bench.txn_orphans import run_orphans

# -- scenario 1: throughput ---------------------------------------------------------------


async def plain_turn(client: RawClient, topic: str, seconds: float) -> Throughput:
    payload = body(0, BODY_SIZE)

    async def one(_: int) -> int:
        return len(await client.send([client.message(topic, payload, transactional=False)]))

    return await timed_producers(PRODUCERS, seconds, one)


async def transactional_turn(client: RawClient, topic: str, seconds: float) -> Throughput:
    payload = body(0, BODY_SIZE)

    async def one(_: int) -> int:
        (entry,) = await client.send([client.message(topic, payload, transactional=True)])
        await client.commit(topic, entry)
        return 1

    return await timed_producers(PRODUCERS, seconds, one)


async def run_throughput(
    server: HalfmoonServer,
    client: RawClient,
    system: str,
    settings: Settings,
    report: Report,
    log: Log,
) -> None:
    plain_topic = fresh_topic(server, "plain", "normal")
    txn_topic = fresh_topic(server, "txn", "transaction")
    # Warm both paths (channel, topic caches, the first transactional append) untimed.
    await plain_turn(client, plain_topic, 0.3)
    await transactional_turn(client, txn_topic, 0.3)
    plain = Result("plain_send", f"plain send, {PRODUCERS} producers, 1 msg/request", system)
    txn = Result("txn_send_commit", f"half send + commit, {PRODUCERS} producers", system)
    for _ in range(settings.rounds):
        for result, turn, topic in (
            (plain, plain_turn, plain_topic),
            (txn, transactional_turn, txn_topic),
        ):
            done = await turn(client, topic, settings.seconds)
            result.messages += done.messages
            result.seconds += done.seconds
    pending = await asyncio.to_thread(pending_count, server)
    txn.extra["pending_after"] = pending
    txn.extra["ratio_to_plain"] = txn.per_second / plain.per_second if plain.per_second else 0.0
    report.results += [plain, txn]
    log(f"{system:<16} plain {plain.per_second:>8,.0f} msg/s   txn {txn.per_second:>8,.0f} msg/s   "
        f"ratio {txn.extra['ratio_to_plain']:.2f}   pending after {pending}")  # fmt: skip


# -- scenario 2: commit-to-visible latency ---------------------------------------------------


async def run_visible_latency(
    server: HalfmoonServer,
    client: RawClient,
    system: str,
    settings: Settings,
    report: Report,
    log: Log,
) -> None:
    topic = fresh_topic(server, "visible", "transaction")
    group = f"txnbench-visible-{next(names)}"
    server.create_group(group, consume_from="earliest")
    consumer = RawClient(server.grpc, f"consumer-{next(names)}")
    arrivals = Arrivals()
    acks: set[asyncio.Task[None]] = set()

    async def consume() -> None:
        while True:
            messages = await consumer.receive(group, topic)
            for message in messages:
                arrivals.arrived(seq_of(message.body))
            if messages:  # ack off the critical path
                task = asyncio.create_task(consumer.ack(group, topic, messages))
                acks.add(task)
                task.add_done_callback(acks.discard)

    polling = asyncio.create_task(consume())
    visible = Result(
        "commit_to_visible", "commit-to-visible (EndTransaction sent -> received)", system
    )
    round_trip = Result("end_transaction_rtt", "EndTransaction COMMIT round trip", system)
    try:
        for seq in range(LATENCY_WARMUP + settings.latency_count):
            (entry,) = await client.send([client.message(topic, body(seq), transactional=True)])
            received = arrivals.expect(seq)
            started = time.perf_counter()
            await client.commit(topic, entry)
            answered = time.perf_counter()
            seen = await asyncio.wait_for(received, 10.0)
            if seq >= LATENCY_WARMUP:
                visible.samples.append(seen - started)
                round_trip.samples.append(answered - started)
    finally:
        polling.cancel()
        await asyncio.gather(polling, *acks, return_exceptions=True)
        await consumer.close()
    visible.extra["visible_before_answer"] = sum(
        1 for v, r in zip(visible.samples, round_trip.samples, strict=True) if v < r
    )
    report.results += [visible, round_trip]
    log(
        f"{system:<16} commit-to-visible p50 {visible.p(0.5):.2f} ms p99 {visible.p(0.99):.2f} ms  "
        " "
        f"EndTransaction p50 {round_trip.p(0.5):.2f} ms p99 {round_trip.p(0.99):.2f} ms"
    )


# -- the run ---------------------------------------------------------------------------------------


def system_name(flush: Flush) -> str:
    return f"halfmoon {flush}"


async def run_server(flush: Flush, settings: Settings, report: Report, log: Log) -> None:
    server_settings = (
        f"transaction.timeout_ms={settings.timeout_ms}ms",
        f"transaction.check_interval_ms={settings.check_interval_ms}ms",
    )
    system = system_name(flush)
    server = HalfmoonServer(flush=flush, settings=server_settings).start()
    try:
        client = RawClient(server.grpc, f"producer-{flush}")
        try:
            if not settings.orphans_only:
                await run_throughput(server, client, system, settings, report, log)
                await run_visible_latency(server, client, system, settings, report, log)
            if flush in settings.orphan_flushes and settings.orphans > 0:
                await run_orphans(server, client, system, settings, report, log)
        finally:
            await client.close()
    finally:
        server.stop()


async def run_all(settings: Settings, log: Log) -> Report:
    report = Report(
        machine=machine_info(),
        settings={
            **asdict(settings),
            "body_bytes": BODY_SIZE,
            "producers": PRODUCERS,
            "orphan_batch": ORPHAN_BATCH,
            "check_workers": CHECK_WORKERS,
        },
    )
    for flush in settings.orphan_flushes if settings.orphans_only else settings.flushes:
        await run_server(flush, settings, report, log)
    report.targets = targets(report, settings)
    return report


def targets(report: Report, settings: Settings) -> list[Target]:
    found = []
    for flush in dict.fromkeys((*settings.flushes, *settings.orphan_flushes)):
        system = system_name(flush)
        txn = report.get("txn_send_commit", system)
        if txn is not None:
            found.append(
                Target(
                    f"txn / plain throughput, {flush}",
                    txn.extra["ratio_to_plain"],
                    TXN_RATIO_GOAL,
                    "x",
                    at_most=False,
                )
            )
        visible = report.get("commit_to_visible", system)
        if visible is not None:
            found.append(
                Target(
                    f"commit-to-visible p99, {flush}",
                    visible.p(0.99),
                    VISIBLE_P99_MS,
                    "ms",
                    at_most=True,
                )
            )
        orphans = report.get("orphans", system)
        if orphans is not None:
            ratio = orphans.extra["ratio_to_answers"]
            measured = ratio if not orphans.extra["unresolved"] and ratio else float("inf")
            found.append(Target(f"{orphans.extra['orphans']:,} orphans / answers time, {flush}",
                                measured, ORPHAN_RATIO_GOAL, "x", at_most=True))  # fmt: skip
    return found


# -- output
# ------------------------------------------------------------------------------------------


def format_result(r: Result) -> str:
    if r.samples:
        return (
            f"p50 {r.p(0.5):7.2f} ms  p99 {r.p(0.99):7.2f} ms  max {max(r.samples) * 1000:7.2f} ms"
        )
    if r.key == "orphans":
        e = r.extra
        return (
            f"{r.messages:,}/{e['orphans']:,} resolved in {r.seconds:.2f} s "
            f"({e['ratio_to_answers'] or 0:.2f}x answers), "
            f"{e['server_cpu_us_per_orphan'] or 0:.0f} us server CPU/orphan; "
            f"{e['scans']} scans, scan wall {e['scan_wall_ms']:,} ms"
        )
    if r.key in ("check_answers", "check_answers_after"):
        return (
            f"{r.messages:,} in {r.seconds:.2f} s ({r.per_second:,.0f}/s), "
            f"{r.extra['server_cpu_us_per_answer']:.0f} us server CPU/answer"
        )
    text = f"{r.per_second:>9,.0f} msg/s"
    if "ratio_to_plain" in r.extra:
        text += f"  ({r.extra['ratio_to_plain']:.2f}x plain)"
    return text


def print_report(report: Report, out: TextIO) -> None:
    out.write("machine:\n" + "".join(f"  {k}: {v}\n" for k, v in report.machine.items()))
    out.write("settings:\n" + "".join(f"  {k}: {v}\n" for k, v in report.settings.items()) + "\n")
    header = f"{'scenario':<52} {'system':<15} result"
    out.write(header + "\n" + "-" * 120 + "\n")
    for r in report.results:
        out.write(f"{r.scenario:<52} {r.system:<15} {format_result(r)}\n")
    out.write("\n")
    header = f"{'target':<48} {'measured':>12} {'goal':>12}  result"
    out.write(header + "\n" + "-" * len(header) + "\n")
    for t in report.targets:
        sign = "<=" if t.at_most else ">="
        out.write(f"{t.name:<48} {t.measured:>9.2f} {t.unit:<2} {sign} {t.goal:>6.2f} {t.unit:<2}  "
                  f"{'PASS' if t.passed else 'MISS'}\n")  # fmt: skip
    out.flush()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.txn_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a short run (2,000 orphans)")
    parser.add_argument("--seconds", type=float, help="seconds per throughput turn")
    parser.add_argument("--rounds", type=int, help="alternating plain / transactional turns")
    parser.add_argument(
        "--latency-count", type=int, help="timed commits in the commit-to-visible run"
    )
    parser.add_argument("--orphans", type=int, help="half messages left undecided (0: skip)")
    parser.add_argument("--flush", choices=["async", "sync", "both"], default="both")
    parser.add_argument("--orphan-flush", choices=["async", "sync", "both"], default="sync",
                        help="flush modes that run the orphan scenario (default sync)")  # fmt: skip
    parser.add_argument(
        "--resolve-timeout", type=float, help="seconds after the orphans are due before giving up"
    )
    parser.add_argument(
        "--orphans-only", action="store_true", help="run the orphan scenario (and its peer) only"
    )
    parser.add_argument("--json", help="also write the results as JSON here")
    return parser.parse_args(argv)


def _flushes(choice: str) -> tuple[Flush, ...]:
    return ("sync", "async") if choice == "both" else (choice,)  # type: ignore[return-value]


def settings_from(args: argparse.Namespace) -> Settings:
    base = QUICK if args.quick else FULL
    return Settings(
        seconds=args.seconds or base.seconds,
        rounds=args.rounds or base.rounds,
        latency_count=args.latency_count or base.latency_count,
        orphans=base.orphans if args.orphans is None else args.orphans,
        flushes=_flushes(args.flush),
        orphan_flushes=_flushes(args.orphan_flush),
        resolve_timeout=args.resolve_timeout or base.resolve_timeout,
        orphans_only=args.orphans_only,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = asyncio.run(run_all(settings_from(args), log))
    print_report(report, sys.stdout)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
