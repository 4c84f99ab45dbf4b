"""halfmoon's Python client beside the official one (``rocketmq-python-client``), same server, same
run.

    python -m bench.client_bench              # full run (about a minute on 2 cores)
    python -m bench.client_bench --quick      # a short run
    python -m bench.client_bench --json out.json --seconds 0.3 --rounds 1 --receive-messages 200

One ``halfmoon serve`` process (``--flush async``) on loopback; every client
runs in this one Python process, one at a time, taking turns round after
round (the order flips each round) so drift on the shared machine hits every
client alike. Bodies are 1 KiB.

* send: ``senders`` concurrent senders, each awaiting its own send before the
  next, for ``seconds`` per round. Official client: ``rocketmq.Producer.send``
  from threads. halfmoon: ``Producer.send`` from asyncio tasks, with its
  default send coalescing and with ``coalesce=False`` (one request per
  message, the way the official client sends).
* receive: a backlog of pre-sent messages drained by 4 concurrent consumers,
  each receiving batches of 32 and acking every message. Official client:
  ``SimpleConsumer.receive(32)`` + ``ack`` from threads, one ack at a time
  (its ``ack_async`` returns no future to wait on). halfmoon:
  ``SimpleConsumer.receive(32)`` + one ``ack`` per message, awaited one at a
  time (like for like) and all at once (``asyncio.gather``, the asyncio idiom).

"vs official" is halfmoon's messages per second over the official client's.
Analysis: docs/benchmarks.md, "Python client vs the official client".
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import platform
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bench.load import BODY_SIZE, Throughput, body
from bench.server_proc import HalfmoonServer
from halfmoon.client import Message, MessageSelector, Producer, SimpleConsumer

OFFICIAL = "official client"
HALFMOON = "halfmoon"
HALFMOON_NO_COALESCE = "halfmoon, coalesce=False"
HALFMOON_ACK_EACH = "halfmoon, acks one at a time"
SEND_SYSTEMS = (OFFICIAL, HALFMOON, HALFMOON_NO_COALESCE)
RECEIVE_SYSTEMS = (OFFICIAL, HALFMOON, HALFMOON_ACK_EACH)
SENDERS = (1, 16)
CONSUMERS = 4
RECEIVE_BATCH = 32
QUEUES = 8
RPC_TIMEOUT = 10  # the official client wants an int
TARGET_RATIO = 2.0  # issue 5: halfmoon >= 2x the official client, 16 senders, 1 KiB

_names = itertools.count()


@dataclass(frozen=True, slots=True)
class Settings:
    seconds: float  # per send run, client and round
    rounds: int  # turns each client takes per scenario
    receive_messages: int  # backlog per receive run


FULL = Settings(seconds=3.0, rounds=3, receive_messages=4000)
QUICK = Settings(seconds=1.0, rounds=2, receive_messages=1000)


@dataclass(slots=True)
class Measurement:
    system: str
    messages: int = 0
    seconds: float = 0.0
    note: str = ""

    def add(self, result: Throughput) -> None:
        self.messages += result.messages
        self.seconds += result.seconds

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


@dataclass(slots=True)
class Row:
    key: str
    scenario: str
    measurements: list[Measurement] = field(default_factory=list)

    def of(self, system: str) -> Measurement:
        for m in self.measurements:
            if m.system == system:
                return m
        raise KeyError(system)

    def ratio(self, system: str) -> float | None:
        official = self.of(OFFICIAL).per_second
        return self.of(system).per_second / official if official > 0 else None


@dataclass(slots=True)
class Report:
    machine: dict[str, Any]
    settings: dict[str, Any]
    rows: list[Row] = field(default_factory=list)

    def row(self, key: str) -> Row:
        for row in self.rows:
            if row.key == key:
                return row
        raise KeyError(key)

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "settings": self.settings,
            "rows": [
                {
                    "key": r.key,
                    "scenario": r.scenario,
                    "measurements": [
                        {**asdict(m), "msgs_per_s": m.per_second, "vs_official": r.ratio(m.system)}
                        for m in r.measurements
                    ],
                }
                for r in self.rows
            ],
        }


# -- the official client (blocking; run in a thread) -------------------------------------


def _official_config(server: HalfmoonServer) -> Any:
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(server.grpc, Credentials(), request_timeout=RPC_TIMEOUT)


def _official_message(topic: str, payload: bytes) -> Any:
    from rocketmq import Message as OfficialMessage

    message = OfficialMessage()
    message.topic = topic
    message.body = payload
    return message


def _run_threads(count: int, work: Callable[[int], int]) -> Throughput:
    counts = [0] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            counts[index] = work(index)
        except BaseException as exc:  # noqa: BLE001 - re-raised after the join
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return Throughput(sum(counts), elapsed)


def official_send(producer: Any, topic: str, senders: int, seconds: float) -> Throughput:
    payload = body(0, BODY_SIZE)
    stop_at = time.monotonic() + seconds

    def sender(_index: int) -> int:
        sent = 0
        while time.monotonic() < stop_at:
            producer.send(_official_message(topic, payload))
            sent += 1
        return sent

    return _run_threads(senders, sender)


def official_receive(consumer: Any, expected: int) -> Throughput:
    """Drain ``expected`` messages; the clock stops at the last ack."""
    lock = threading.Lock()
    done = [0]
    finished_at = [0.0]

    def worker(_index: int) -> int:
        mine = 0
        while True:
            with lock:
                if done[0] >= expected:
                    return mine
            for message in consumer.receive(RECEIVE_BATCH, 30):
                consumer.ack(message)
                mine += 1
                with lock:
                    done[0] += 1
                    if done[0] == expected:
                        finished_at[0] = time.perf_counter()

    started = time.perf_counter()
    result = _run_threads(CONSUMERS, worker)
    return Throughput(result.messages, (finished_at[0] or time.perf_counter()) - started)


# -- halfmoon's client -----------------------------------------------------------------------


async def halfmoon_send(producer: Producer, topic: str, senders: int, seconds: float) -> Throughput:
    loop = asyncio.get_running_loop()
    payload = body(0, BODY_SIZE)
    stop_at = loop.time() + seconds

    async def sender() -> int:
        sent = 0
        while loop.time() < stop_at:
            await producer.send(Message(topic, payload))
            sent += 1
        return sent

    started = time.perf_counter()
    counts = await asyncio.gather(*(sender() for _ in range(senders)))
    return Throughput(sum(counts), time.perf_counter() - started)


async def halfmoon_receive(
    consumer: SimpleConsumer, expected: int, *, ack_together: bool
) -> Throughput:
    done = 0
    finished = asyncio.Event()
    finished_at = 0.0

    async def worker() -> None:
        nonlocal done, finished_at
        while done < expected:
            batch = await consumer.receive(RECEIVE_BATCH, 30, wait=1.0)
            if ack_together:
                await asyncio.gather(*(consumer.ack(m) for m in batch))
            else:
                for message in batch:
                    await consumer.ack(message)
            done += len(batch)
            if done >= expected and not finished.is_set():
                finished_at = time.perf_counter()
                finished.set()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONSUMERS)))
    return Throughput(done, (finished_at or time.perf_counter()) - started)


# -- scenarios ---------------------------------------------------------------------------------


def _turns(systems: tuple[str, ...], round_index: int) -> tuple[str, ...]:
    # Flip the order each round so neither client always runs first (warmer, or cooler).
    return systems if round_index % 2 == 0 else tuple(reversed(systems))


async def send_rows(
    server: HalfmoonServer, settings: Settings, log: Callable[[str], None]
) -> list[Row]:
    from rocketmq import Producer as OfficialProducer

    topics = {system: f"client-bench-send-{next(_names)}" for system in SEND_SYSTEMS}
    for topic in topics.values():
        server.create_topic(topic, queues=QUEUES)
    official = OfficialProducer(_official_config(server), (topics[OFFICIAL],))
    await asyncio.to_thread(official.startup)
    coalescing = Producer(server.grpc, topics=[topics[HALFMOON]])
    plain = Producer(server.grpc, topics=[topics[HALFMOON_NO_COALESCE]], coalesce=False)
    rows = []
    try:
        await coalescing.start()
        await plain.start()
        # Warm routes and channels before any clock starts.
        await asyncio.to_thread(official.send, _official_message(topics[OFFICIAL], b"warm"))
        await coalescing.send(Message(topics[HALFMOON], b"warm"))
        await plain.send(Message(topics[HALFMOON_NO_COALESCE], b"warm"))
        runs: dict[str, Callable[[int], Awaitable[Throughput]]] = {
            OFFICIAL: lambda n: asyncio.to_thread(
                official_send, official, topics[OFFICIAL], n, settings.seconds
            ),
            HALFMOON: lambda n: halfmoon_send(coalescing, topics[HALFMOON], n, settings.seconds),
            HALFMOON_NO_COALESCE: lambda n: halfmoon_send(
                plain, topics[HALFMOON_NO_COALESCE], n, settings.seconds
            ),
        }
        for senders in SENDERS:
            row = Row(
                f"send_s{senders}",
                f"send, {senders} concurrent sender{'s' if senders > 1 else ''}, 1 KiB",
                [Measurement(s) for s in SEND_SYSTEMS],
            )
            before = (coalescing.stats.requests, coalescing.stats.messages)
            for round_index in range(settings.rounds):
                for system in _turns(SEND_SYSTEMS, round_index):
                    result = await runs[system](senders)
                    row.of(system).add(result)
                    log(
                        f"{row.key} round {round_index + 1} {system}: {result.per_second:,.0f} "
                        "msgs/s"
                    )
            requests = coalescing.stats.requests - before[0]
            messages = coalescing.stats.messages - before[1]
            row.of(HALFMOON).note = (
                f"{messages / requests:.1f} messages per request" if requests else ""
            )
            rows.append(row)
    finally:
        await coalescing.close()
        await plain.close()
        await asyncio.to_thread(official.shutdown)
    return rows


async def _backlog(server: HalfmoonServer, count: int) -> tuple[str, str]:
    topic, group = f"client-bench-recv-{next(_names)}", f"client-bench-recv-g-{next(_names)}"
    server.create_topic(topic, queues=QUEUES)
    server.create_group(group)
    async with Producer(server.grpc, topics=[topic]) as producer:
        await producer.send_batch([Message(topic, body(i, BODY_SIZE)) for i in range(count)])
    return topic, group


async def receive_row(
    server: HalfmoonServer, settings: Settings, log: Callable[[str], None]
) -> Row:
    from rocketmq import FilterExpression
    from rocketmq import SimpleConsumer as OfficialSimpleConsumer

    count = settings.receive_messages
    row = Row(
        "receive",
        f"receive, {CONSUMERS} consumers, batches of {RECEIVE_BATCH} + ack each, 1 KiB",
        [Measurement(s) for s in RECEIVE_SYSTEMS],
    )

    async def official_run() -> Throughput:
        topic, group = await _backlog(server, count)
        consumer = OfficialSimpleConsumer(
            _official_config(server), group, {topic: FilterExpression()}, await_duration=1
        )
        await asyncio.to_thread(consumer.startup)
        try:
            return await asyncio.to_thread(official_receive, consumer, count)
        finally:
            await asyncio.to_thread(consumer.shutdown)

    async def halfmoon_run(ack_together: bool) -> Throughput:
        topic, group = await _backlog(server, count)
        async with SimpleConsumer(server.grpc, group, {topic: MessageSelector.all()}) as consumer:
            return await halfmoon_receive(consumer, count, ack_together=ack_together)

    runs: dict[str, Callable[[], Awaitable[Throughput]]] = {
        OFFICIAL: official_run,
        HALFMOON: lambda: halfmoon_run(True),
        HALFMOON_ACK_EACH: lambda: halfmoon_run(False),
    }
    for round_index in range(settings.rounds):
        for system in _turns(RECEIVE_SYSTEMS, round_index):
            result = await runs[system]()
            row.of(system).add(result)
            log(f"receive round {round_index + 1} {system}: {result.per_second:,.0f} msgs/s")
    return row


def machine_info() -> dict[str, Any]:
    import os
    from importlib.metadata import version

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "rocketmq-python-client": version("rocketmq-python-client"),
    }


async def run_all(settings: Settings, log: Callable[[str], None]) -> Report:
    report = Report(
        machine_info(),
        asdict(settings) | {"body_bytes": BODY_SIZE, "flush": "async", "queues": QUEUES},
    )
    with HalfmoonServer(flush="async") as server:
        report.rows.extend(await send_rows(server, settings, log))
        report.rows.append(await receive_row(server, settings, log))
    return report


# -- output ------------------------------------------------------------------------------------


def format_rows(rows: list[Row]) -> str:
    lines = [f"{'scenario':<56} {'client':<30} {'msgs/s':>10} {'vs official':>12}  note", "-" * 120]
    for row in rows:
        for m in row.measurements:
            ratio = row.ratio(m.system)
            shown = "" if m.system == OFFICIAL or ratio is None else f"{ratio:.2f}x"
            lines.append(
                f"{row.scenario:<56} {m.system:<30} {m.per_second:>10,.0f} {shown:>12}  {m.note}"
            )
    return "\n".join(lines)


def print_report(report: Report, out: TextIO) -> None:
    out.write("machine:\n" + "".join(f"  {k}: {v}\n" for k, v in report.machine.items()))
    out.write("settings:\n" + "".join(f"  {k}: {v}\n" for k, v in report.settings.items()) + "\n")
    out.write(format_rows(report.rows) + "\n\n")
    ratio = report.row("send_s16").ratio(HALFMOON) or 0.0
    verdict = "PASS" if ratio >= TARGET_RATIO else "MISS"
    out.write(
        f"target: halfmoon >= {TARGET_RATIO:.0f}x the official client, 16 senders, 1 KiB: "
        f"{ratio:.2f}x  {verdict}\n"
    )
    out.flush()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.client_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a short run (about 20 s)")
    parser.add_argument("--seconds", type=float, help="seconds per send run, client and round")
    parser.add_argument("--rounds", type=int, help="turns each client takes per scenario")
    parser.add_argument("--receive-messages", type=int, help="backlog drained per receive run")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    base = QUICK if args.quick else FULL
    return Settings(
        seconds=args.seconds or base.seconds,
        rounds=args.rounds or base.rounds,
        receive_messages=args.receive_messages or base.receive_messages,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = asyncio.run(run_all(settings, log))
    print_report(report, sys.stdout)
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
