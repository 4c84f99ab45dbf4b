"""Single-message sends: local mode, cluster mode through 1 and 2 proxies, RabbitMQ.

    .venv/bin/python -m bench.proxy_bench [--seconds 3] [--producers 1,16,64] [--json out.json]

In one run, on this machine, every producer sends one 1 KiB message at a time
and waits for its acknowledgement, for ``--seconds``, with 1, 16 and 64
concurrent producers, through two clients:

- ``raw``: halfmoon's raw-gRPC load generator (one SendMessage per message) and,
  for RabbitMQ, confirmed persistent publishes (aio-pika), one in flight each;
- ``official``: the official Python client, ``rocketmq.Producer.send`` from
  threads (RocketMQ endpoints only).

Targets (the ``flush async`` setting everywhere):

- ``local``: ``halfmoon serve``, proxy and broker in one process;
- ``cluster 1p``: one ``halfmoon broker`` and one ``halfmoon proxy --broker``
  (the proxy's sends on the broker's send listener);
- ``cluster 2p``: the same broker and two proxy processes on separate ports,
  the producers split between them (``halfmoon proxy`` has no ``--workers``
  yet; two processes are what N workers would be);
- ``cluster 1w``, ``cluster 2w``: etcd, the broker registered in a cluster, and
  one ``halfmoon proxy --cluster --workers N`` (N worker processes sharing one
  port with ``SO_REUSEPORT``); each worker's CPU and the supervising parent's
  are measured. Skipped, with a note, when ``etcd`` is not installed;
- ``rabbitmq``: the RabbitMQ at ``$HALFMOON_AMQP_URL`` (127.0.0.1:5672), its
  ``beam.smp`` measured.

Every client opens ``--connections`` connections per endpoint (8 by default;
the raw generator's channels and the official producers each their own), the
producers spread over them, for every target alike: ``SO_REUSEPORT`` spreads
*connections* over a proxy's workers, so one connection would leave all but
one worker idle.

Printed per row: messages per second, latency p50/p99 of each send under that
load, messages per internal send request (cluster rows: the broker's own
count, every proxy and worker together: how much the proxies coalesced), and
CPU per message of every server process (user + system from /proc/PID/stat,
over the measured interval), then the issue's targets beside the figures. The
machine is shared: run it more than once and report ranges.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.amqp_peer import AmqpPeer
from bench.cluster_procs import BrokerServer, ProxyServer
from bench.halfmoon_peer import GrpcPeer, official_client_produce
from bench.load import Throughput, machine_info, percentile
from bench.server_proc import HalfmoonServer
from bench.txn_group_bench import start_etcd
from halfmoon.cluster.internal.connection import BrokerConnection

PRODUCERS = (1, 16, 64)
TICKS = os.sysconf("SC_CLK_TCK")

# The targets.
BROKER_US_PER_MSG = 40.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a whole process (every thread), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def beam_pid() -> int | None:
    """RabbitMQ's Erlang VM on this machine, if it runs here."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "beam.smp":
                    return int(entry.name)
            except OSError:
                continue
    return None


@dataclass
class Row:
    target: str
    client: str
    producers: int
    messages: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_msg: dict[str, float] = field(default_factory=dict)
    msgs_per_request: float | None = None  # cluster rows: messages per internal send request

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        cpu = "  ".join(f"{name} {us:,.0f}" for name, us in self.cpu_us_per_msg.items())
        per_request = "" if self.msgs_per_request is None else f"{self.msgs_per_request:.1f}"
        return (
            f"{self.target:<11} {self.client:<9} {self.producers:>4} {self.per_second:>9,.0f}"
            f" {self.p50_ms:>8.2f} {self.p99_ms:>8.2f} {per_request:>7}   {cpu}"
        )


HEADER = (
    f"{'target':<11} {'client':<9} {'prod':>4} {'msg/s':>9} {'p50 ms':>8} {'p99 ms':>8}"
    f" {'msg/req':>7}   server CPU µs/msg per process"
)


def send_stats(broker_address: str | None) -> dict[str, int] | None:
    """The broker's count of internal send requests and the messages they carried."""
    if broker_address is None:
        return None
    connection = BrokerConnection(broker_address)
    try:
        return dict(connection.call("send_stats"))
    finally:
        connection.close()


async def measure(
    target: str,
    client: str,
    producers: int,
    processes: dict[str, int],
    run: Callable[[list[float]], Awaitable[Throughput]],
    broker_address: str | None = None,
) -> Row:
    latencies: list[float] = []
    sent_before = send_stats(broker_address)
    before = {name: cpu_seconds(pid) for name, pid in processes.items()}
    result = await run(latencies)
    after = {name: cpu_seconds(pid) for name, pid in processes.items()}
    sent_after = send_stats(broker_address)
    per_request = None
    if sent_before is not None and sent_after is not None:
        requests = sent_after["requests"] - sent_before["requests"]
        carried = sent_after["messages"] - sent_before["messages"]
        per_request = carried / requests if requests else 0.0
    messages = max(result.messages, 1)
    return Row(
        target,
        client,
        producers,
        result.messages,
        result.seconds,
        percentile(latencies, 0.5) * 1000 if latencies else 0.0,
        percentile(latencies, 0.99) * 1000 if latencies else 0.0,
        {name: (after[name] - before[name]) / messages * 1e6 for name in processes},
        per_request,
    )


def split(producers: int, parts: int) -> list[int]:
    """``producers`` spread over ``parts`` endpoints (some get none when there are fewer)."""
    return [producers // parts + (1 if i < producers % parts else 0) for i in range(parts)]


def combined(results: list[Throughput]) -> Throughput:
    return Throughput(sum(r.messages for r in results), max(r.seconds for r in results))


async def run_rocketmq_target(
    target: str,
    servers: list[HalfmoonServer],
    processes: dict[str, int],
    settings: argparse.Namespace,
    log: Callable[[Row], None],
    broker_address: str | None = None,
) -> list[Row]:
    rows = []
    connections = settings.connections
    peers = [
        GrpcPeer(server, f"{target}-{i}", own_connection=connections > 1)
        for server in servers
        for i in range(connections)
    ]
    endpoints = [server for server in servers for _ in range(connections)]
    try:
        for peer in peers:  # warm channels and code paths before anything is timed
            await peer.produce(4, 1, min(0.3, settings.seconds))
        for producers in settings.producers:
            shares = split(producers, len(peers))

            async def raw(latencies: list[float], shares: list[int] = shares) -> Throughput:
                return combined(
                    await asyncio.gather(
                        *(
                            peer.produce(n, 1, settings.seconds, latencies)
                            for peer, n in zip(peers, shares, strict=True)
                            if n
                        )
                    )
                )

            rows.append(await measure(target, "raw", producers, processes, raw, broker_address))
            log(rows[-1])
        for producers in settings.producers:
            shares = split(producers, len(endpoints))

            async def official(latencies: list[float], shares: list[int] = shares) -> Throughput:
                return combined(
                    await asyncio.gather(
                        *(
                            asyncio.to_thread(
                                official_client_produce, server, n, settings.seconds, latencies
                            )
                            for server, n in zip(endpoints, shares, strict=True)
                            if n
                        )
                    )
                )

            rows.append(
                await measure(target, "official", producers, processes, official, broker_address)
            )
            log(rows[-1])
    finally:
        for peer in peers:
            await peer.close()
    return rows


async def run_local(settings: argparse.Namespace, log: Callable[[Row], None]) -> list[Row]:
    server = HalfmoonServer(flush="async").start()
    try:
        return await run_rocketmq_target("local", [server], {"serve": server.pid}, settings, log)
    finally:
        server.stop()


async def run_cluster(
    proxies: int, settings: argparse.Namespace, log: Callable[[Row], None]
) -> list[Row]:
    broker = BrokerServer(flush="async").start()
    started: list[ProxyServer] = []
    try:
        for _ in range(proxies):
            started.append(ProxyServer(broker).start())
        processes = {"broker": broker.pid}
        processes.update({f"proxy{i + 1}": p.pid for i, p in enumerate(started)})
        target = f"cluster {proxies}p"
        return await run_rocketmq_target(
            target, list(started), processes, settings, log, broker.address
        )
    finally:
        for proxy in started:
            proxy.stop()
        broker.stop()


async def run_rabbitmq(settings: argparse.Namespace, log: Callable[[Row], None]) -> list[Row]:
    peer = await AmqpPeer.open(settings.amqp)
    pid = beam_pid()
    processes = {"beam.smp": pid} if pid is not None else {}
    rows = []
    try:
        await peer.produce(4, 1, min(0.3, settings.seconds))
        for producers in settings.producers:

            async def raw(latencies: list[float], producers: int = producers) -> Throughput:
                return await peer.produce(producers, 1, settings.seconds, latencies)

            rows.append(await measure("rabbitmq", "raw", producers, processes, raw))
            log(rows[-1])
    finally:
        await peer.close()
    return rows


async def run_workers(
    workers: int, settings: argparse.Namespace, log: Callable[[Row], None]
) -> list[Row]:
    """One broker and one ``halfmoon proxy --workers N`` joined through a real etcd."""
    root = Path(tempfile.mkdtemp(prefix="halfmoon-bench-etcd-"))
    etcd, url = start_etcd(root / "etcd")
    cluster = ("--cluster", "bench", "--coordinator", url)
    broker: BrokerServer | None = None
    proxy: ProxyServer | None = None
    try:
        broker = BrokerServer(flush="async", cluster=cluster).start()
        proxy = ProxyServer(broker, cluster=cluster, workers=workers).start()
        processes = {"broker": broker.pid, "proxy": proxy.pid}
        processes.update({f"proxy-w{i + 1}": pid for i, pid in enumerate(proxy.worker_pids())})
        target = f"cluster {workers}w"
        return await run_rocketmq_target(target, [proxy], processes, settings, log, broker.address)
    finally:
        if proxy is not None:
            proxy.stop()
        if broker is not None:
            broker.stop()
        etcd.terminate()
        etcd.wait(30)
        shutil.rmtree(root, ignore_errors=True)


def proxy_us(row: Row) -> float:
    return sum(us for name, us in row.cpu_us_per_msg.items() if name.startswith("proxy"))


def targets(rows: list[Row]) -> list[str]:
    """The issue's three targets, each with the figures it compares and a verdict."""

    def find(target: str, client: str, producers: int) -> Row | None:
        return next(
            (r for r in rows if (r.target, r.client, r.producers) == (target, client, producers)),
            None,
        )

    lines = []
    for client in ("raw", "official"):
        for producers in sorted({r.producers for r in rows if r.producers > 1}):
            local = find("local", client, producers)
            for cluster in ("cluster 1p", "cluster 2p", "cluster 1w", "cluster 2w"):
                row = find(cluster, client, producers)
                if row is None or local is None:
                    continue
                broker = row.cpu_us_per_msg["broker"]
                proxy = proxy_us(row)
                serve = local.cpu_us_per_msg["serve"]
                lines.append(
                    f"{cluster} {client:<8} {producers:>2} producers: broker {broker:,.0f} µs/msg"
                    f" (target ≤ {BROKER_US_PER_MSG:.0f}: {verdict(broker <= BROKER_US_PER_MSG)});"
                    f" proxies {proxy:,.0f} µs/msg vs local {serve:,.0f}"
                    f" ({verdict(proxy <= serve)})"
                )
            for cluster in ("cluster 2p", "cluster 2w"):
                two = find(cluster, client, producers)
                if two is None or local is None:
                    continue
                ratio = two.per_second / local.per_second if local.per_second else 0.0
                lines.append(
                    f"{cluster} {client:<8} {producers:>2} producers: {two.per_second:,.0f} msg/s"
                    f" vs local {local.per_second:,.0f} = {ratio:.2f}x"
                    f" (target ≥ 1: {verdict(ratio >= 1)})"
                )
    return lines


def verdict(passed: bool) -> str:
    return "met" if passed else "MISSED"


async def run_all(settings: argparse.Namespace, log: Callable[[Row], None]) -> list[Row]:
    chosen = set(settings.targets.split(","))
    rows = await run_local(settings, log) if "local" in chosen else []
    for proxies in (1, 2):
        if f"{proxies}p" in chosen:
            rows += await run_cluster(proxies, settings, log)
    if shutil.which("etcd") is None:
        print("etcd is not installed: no --workers rows (./run test installs it)", flush=True)
    else:
        for workers in (1, 2):
            if f"{workers}w" in chosen:
                rows += await run_workers(workers, settings, log)
    if not settings.no_rabbitmq and "rabbitmq" in chosen:
        rows += await run_rabbitmq(settings, log)
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy_bench", description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument(
        "--producers",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=PRODUCERS,
        help="comma-separated producer counts (default 1,16,64)",
    )
    parser.add_argument(
        "--connections",
        type=int,
        default=8,
        help="connections per endpoint, producers spread over them (default 8)",
    )
    parser.add_argument(
        "--targets",
        default="local,1p,2p,1w,2w,rabbitmq",
        help="comma-separated subset of local,1p,2p,1w,2w,rabbitmq",
    )
    parser.add_argument("--amqp", default=None, help="RabbitMQ URL (default $HALFMOON_AMQP_URL)")
    parser.add_argument("--no-rabbitmq", action="store_true", help="skip the RabbitMQ peer")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    print(json.dumps(machine_info()), flush=True)
    print(HEADER, flush=True)
    started = time.monotonic()
    rows = asyncio.run(run_all(settings, lambda row: print(row.line(), flush=True)))
    print(f"\ntargets (run took {time.monotonic() - started:.0f} s):")
    found = targets(rows)
    for line in found:
        print("  " + line)
    if settings.json is not None:
        data: dict[str, Any] = {
            "machine": machine_info(),
            "rows": [asdict(r) for r in rows],
            "targets": found,
        }
        settings.json.write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
