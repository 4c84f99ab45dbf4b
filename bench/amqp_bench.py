"""halfmoon's AMQP 0-9-1 endpoint beside RabbitMQ and the bare floor, through pika and aio-pika.

    python -m bench.amqp_bench                        # ~3 minutes
    python -m bench.amqp_bench --seconds 5 --count 500 --json out.json

Systems, measured in the same run, one after the other:

* RabbitMQ at ``HALFMOON_TEST_AMQP`` (default 127.0.0.1:5672), the reference:
  every ratio is to it; its server CPU is its Erlang VM's (``beam.smp``);
* halfmoon: ``halfmoon serve --flush sync`` with its AMQP listener on a free
  port, when this halfmoon has one (``server.amqp_listen``) and it answers;
  otherwise its rows say why they are missing;
* the floor: ``bench/amqp_floor.py``, a bare asyncio server (and the same on
  uvloop) answering the same frames from memory, with no store.

Durable queues and persistent messages everywhere; a publish counts once
confirmed (or committed). Scenarios (bench/amqp_aiopika.py, bench/amqp_pika.py):
end to end (one publisher, paced: 2 ms idle before each send; p50 and p99),
confirmed throughput with 1 and 16 publishers, consume with prefetch 100 and
4 consumers acking (aio-pika), ``tx.commit`` of 1 and of 10 messages (take k,
publish k, ack k, commit: transactions per second), and a fanout to 10 queues:
bytes the server process wrote per message (``/proc/<pid>/io``: ``wchar``,
what it passed to write(); ``write_bytes``, what reached the block layer) and,
for halfmoon, its commit log's growth per message (``bench/commitlog_size.py``:
the segment files' written end) beside the same publishes to one queue, whose
growth is the message's own record.
Server CPU per message (user + system from ``/proc/<pid>/stat``) beside each
throughput. Results and what they mean: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.amqp_aiopika import AioPikaScenarios
from bench.amqp_floor import AmqpFloorServer
from bench.amqp_peer import QUEUE_EXPIRES_MS, amqp_url
from bench.amqp_pika import PikaScenarios
from bench.commitlog_size import commit_log_end
from bench.load import Throughput, find_process, machine_info, percentile, process_cpu_seconds
from bench.server_proc import HalfmoonServer

RABBITMQ, HALFMOON = "RabbitMQ", "halfmoon"
FLOOR, FLOOR_UVLOOP = "floor (asyncio)", "floor (uvloop)"
SETTLE_S = 0.002
SETTLE_WRITES_S = 1.0  # the server's background writes of a run land within this
FANOUT_QUEUES = 10
TX_CHANNELS = 16  # channels committing transactions of 1 at once
BODY = 1024


@dataclasses.dataclass
class System:
    name: str
    url: str
    pid: int | None
    queue_arguments: dict[str, Any]
    data_dir: Path | None = None  # halfmoon's: its commit log's growth is measured

    def cpu(self) -> float | None:
        return process_cpu_seconds(self.pid) if self.pid is not None else None

    def io(self) -> dict[str, int] | None:
        if self.pid is None:
            return None
        try:
            text = Path(f"/proc/{self.pid}/io").read_text()
        except OSError:
            return None
        return {k: int(v) for k, v in (line.split(": ") for line in text.splitlines())}


def _throughput_row(system: System, run: Callable[[], Throughput], per: int = 1) -> dict[str, Any]:
    """``run`` measured with the server's CPU around it; ``per``: messages per counted unit."""
    before = system.cpu()
    result = run()
    after = system.cpu()
    row: dict[str, Any] = {"per_second": result.per_second, "count": result.messages}
    if before is not None and after is not None and result.messages:
        row["server_cpu_us_per_message"] = (after - before) * 1e6 / (result.messages * per)
    return row


def _latency_row(samples: list[float]) -> dict[str, Any]:
    return {
        "p50_ms": percentile(samples, 0.5) * 1000,
        "p99_ms": percentile(samples, 0.99) * 1000,
        "samples": len(samples),
    }


def measure_aiopika(system: System, args: argparse.Namespace) -> dict[str, Any]:
    async def scenarios() -> dict[str, Any]:
        s = await AioPikaScenarios.open(system.url, system.queue_arguments)
        loop = asyncio.get_running_loop()

        async def throughput(coro_fn: Callable[[], Any], per: int = 1) -> dict[str, Any]:
            before = system.cpu()
            result: Throughput = await coro_fn()
            after = system.cpu()
            row: dict[str, Any] = {"per_second": result.per_second, "count": result.messages}
            if before is not None and after is not None and result.messages:
                cpu = (after - before) * 1e6 / (result.messages * per)
                row["server_cpu_us_per_message"] = cpu
            return row

        try:
            out: dict[str, Any] = {}
            out["end_to_end"] = _latency_row(await s.end_to_end(args.count, SETTLE_S))
            out["confirmed_1"] = await throughput(lambda: s.confirmed(1, args.seconds))
            out["confirmed_16"] = await throughput(lambda: s.confirmed(16, args.seconds))
            cpu_at_start: list[float | None] = []

            async def mark() -> None:
                cpu_at_start.append(system.cpu())

            consumed = await s.consume(args.consume, 4, mark)
            after = system.cpu()
            out["consume_4x100"] = {"per_second": consumed.per_second, "count": consumed.messages}
            if cpu_at_start[0] is not None and after is not None:
                cpu = (after - cpu_at_start[0]) * 1e6 / consumed.messages
                out["consume_4x100"]["server_cpu_us_per_message"] = cpu
            for k in (1, 10):
                source = await s.tx_fill(args.tx_fill * k)
                out[f"tx_{k}"] = await throughput(
                    lambda k=k, src=source: s.tx(src, k, args.seconds, args.tx_fill * k), per=2 * k
                )
            # Many channels committing at once: where a group commit can share one fsync
            # between transactions (one channel's commits are one after another on any broker).
            fill = args.tx_fill * TX_CHANNELS
            source = await s.tx_fill(fill)
            out[f"tx_1x{TX_CHANNELS}"] = await throughput(
                lambda: s.tx(source, 1, args.seconds, fill, channels=TX_CHANNELS), per=2
            )
            # Each reading of the log follows a settle, so each window holds its own run and
            # its background writes (offsets, timers), not the scenario's before it.
            await asyncio.sleep(SETTLE_WRITES_S)
            log_start = commit_log_end(system.data_dir) if system.data_dir else None
            if system.data_dir is not None:
                # The same publishes to one queue: the bytes of the message's own record.
                await s.fanout(1, args.fanout)
                await asyncio.sleep(SETTLE_WRITES_S)
                log_one = commit_log_end(system.data_dir)
            io_before = system.io()
            await s.fanout(FANOUT_QUEUES, args.fanout)
            await asyncio.sleep(SETTLE_WRITES_S)
            io_after = system.io()
            out["fanout_10"] = {}
            if io_before is not None and io_after is not None:
                out["fanout_10"] = {
                    key: (io_after[key] - io_before[key]) / args.fanout
                    for key in ("wchar", "write_bytes")
                }
            if system.data_dir is not None and log_start is not None:
                record = (log_one - log_start) / args.fanout
                fanned = (commit_log_end(system.data_dir) - log_one) / args.fanout
                out["fanout_10"]["record_bytes"] = record
                out["fanout_10"]["commit_log_bytes"] = fanned
                out["fanout_10"]["commit_log_ratio"] = fanned / record if record else None
            del loop
            return out
        finally:
            await s.close()

    return asyncio.run(scenarios())


def measure_pika(system: System, args: argparse.Namespace) -> dict[str, Any]:
    s = PikaScenarios(system.url, system.queue_arguments)
    try:
        out: dict[str, Any] = {"end_to_end": _latency_row(s.end_to_end(args.count, SETTLE_S))}
        out["confirmed_1"] = _throughput_row(system, lambda: s.confirmed(1, args.seconds))
        out["confirmed_16"] = _throughput_row(system, lambda: s.confirmed(16, args.seconds))
        for k in (1, 10):
            source = s.tx_fill(args.tx_fill * k)
            out[f"tx_{k}"] = _throughput_row(
                system,
                lambda k=k, src=source: s.tx(src, k, args.seconds, args.tx_fill * k),
                per=2 * k,
            )
        return out
    finally:
        s.close()


@contextlib.contextmanager
def halfmoon_system() -> Iterator[System | str]:
    """halfmoon with its AMQP listener on a free port, or why there is none."""
    from halfmoon.config import ServerConfig

    if not any(f.name == "amqp_listen" for f in dataclasses.fields(ServerConfig)):
        yield "no AMQP listener in this halfmoon (server.amqp_listen)"
        return
    os.environ["HALFMOON_SERVER_AMQP_LISTEN"] = "127.0.0.1:0"
    server = HalfmoonServer(flush="sync")
    try:
        server.start()
        ready = next((line for line in server.lines if "halfmoon ready" in line), "")
        found = re.search(r"\bamqp=(\S+)", ready)
        if found is None:
            yield f"the ready line names no AMQP listener: {ready!r}"
            return
        assert server.proc is not None
        url = f"amqp://guest:guest@{found.group(1)}/"
        yield System(HALFMOON, url, server.proc.pid, {}, server.data_dir)
    finally:
        server.stop()


def _probe(system: System) -> str | None:
    """None when the server completes an AMQP handshake, else why not."""
    import pika

    try:
        pika.BlockingConnection(pika.URLParameters(system.url)).close()
    except Exception as exc:  # noqa: BLE001 - any failure is reported in the table
        return f"{system.url} did not answer AMQP: {exc!r}"
    return None


def run_system(system: System, args: argparse.Namespace) -> dict[str, Any]:
    reason = _probe(system)
    if reason is not None:
        return {"missing": reason}
    result: dict[str, Any] = {}
    for client, measure in (("aio-pika", measure_aiopika), ("pika", measure_pika)):
        try:
            result[client] = measure(system, args)
        except Exception as exc:  # noqa: BLE001 - a failing system's rows say why
            result[client] = {"missing": f"{type(exc).__name__}: {exc}"}
    return result


# -- the table ----------------------------------------------------------------------------

METRICS = (
    ("end to end p50 (ms)", "end_to_end", "p50_ms", False),
    ("end to end p99 (ms)", "end_to_end", "p99_ms", False),
    ("confirmed, 1 publisher (msg/s)", "confirmed_1", "per_second", True),
    ("confirmed, 16 publishers (msg/s)", "confirmed_16", "per_second", True),
    ("consume, 4 × prefetch 100 (msg/s)", "consume_4x100", "per_second", True),
    ("tx.commit of 1 (tx/s)", "tx_1", "per_second", True),
    ("tx.commit of 10 (tx/s)", "tx_10", "per_second", True),
    (f"tx.commit of 1, {TX_CHANNELS} channels (tx/s)", f"tx_1x{TX_CHANNELS}", "per_second", True),
    ("fanout to 10: wchar per message (B)", "fanout_10", "wchar", False),
    ("fanout to 10: write_bytes per message (B)", "fanout_10", "write_bytes", False),
    ("one queue: commit-log bytes per message (B)", "fanout_10", "record_bytes", False),
    ("fanout to 10: commit-log bytes per message (B)", "fanout_10", "commit_log_bytes", False),
    ("fanout to 10: commit-log bytes ÷ one queue's", "fanout_10", "commit_log_ratio", False),
)
CPU_METRICS = (
    "confirmed_1", "confirmed_16", "consume_4x100", "tx_1", "tx_10", f"tx_1x{TX_CHANNELS}",
)  # fmt: skip


def _value(results: dict[str, Any], system: str, client: str, scenario: str, key: str) -> Any:
    return results.get(system, {}).get(client, {}).get(scenario, {}).get(key)


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def format_table(results: dict[str, Any]) -> str:
    systems = [RABBITMQ, HALFMOON, FLOOR, FLOOR_UVLOOP]
    header = ["metric", "client", *systems, "halfmoon ÷ RabbitMQ", "floor (uvloop) ÷ RabbitMQ"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    rows = [(label, scenario, key) for label, scenario, key, _ in METRICS]
    rows += [(f"server CPU µs/msg, {s}", s, "server_cpu_us_per_message") for s in CPU_METRICS]
    for client in ("aio-pika", "pika"):
        for label, scenario, key in rows:
            values = [_value(results, s, client, scenario, key) for s in systems]
            if all(v is None for v in values):
                continue
            reference = values[0]

            def ratio(v: float | None, reference: float | None = reference) -> str:
                return f"{v / reference:.2f}×" if v is not None and reference else "—"

            cells = [label, client, *map(_fmt, values), ratio(values[1]), ratio(values[3])]
            lines.append("| " + " | ".join(cells) + " |")
    for system in systems:
        for client, measured in results.get(system, {}).items():
            if isinstance(measured, dict) and "missing" in measured:
                lines.append(f"\n{system} ({client}): {measured['missing']}")
        if "missing" in results.get(system, {}):
            lines.append(f"\n{system}: {results[system]['missing']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.amqp_bench", description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="per throughput scenario")
    parser.add_argument("--count", type=int, default=300, help="end-to-end samples")
    parser.add_argument("--consume", type=int, default=5000, help="messages to consume")
    parser.add_argument("--tx-fill", type=int, default=400, help="transactions' worth queued")
    parser.add_argument("--fanout", type=int, default=500, help="fanout messages")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    started = time.time()
    results: dict[str, Any] = {}
    rabbitmq = System(RABBITMQ, amqp_url(), find_process("beam.smp"), {
        "x-expires": QUEUE_EXPIRES_MS,  # only removes a queue a crashed run left behind
    })  # fmt: skip
    results[RABBITMQ] = run_system(rabbitmq, args)
    with halfmoon_system() as halfmoon:
        if isinstance(halfmoon, str):
            results[HALFMOON] = {"missing": halfmoon}
        else:
            results[HALFMOON] = run_system(halfmoon, args)
    for name, use_uvloop in ((FLOOR, False), (FLOOR_UVLOOP, True)):
        with AmqpFloorServer(use_uvloop=use_uvloop) as floor:
            results[name] = run_system(System(name, floor.url, floor.pid, {}), args)
    table = format_table(results)
    print(table)
    print(f"\n{machine_info()} — {time.time() - started:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps({"results": results, "machine": machine_info()}, indent=1, default=str)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
