"""Concurrent single-message sends through ``RemoteBroker`` vs the in-process broker.

    .venv/bin/python -m bench.cluster_bench [--seconds 3] [--threads 1,16,64] [--flush sync]

For each thread count, the same load (each thread sends one 1 KiB message
at a time, waiting for its answer) runs against:

- ``in-process``: ``halfmoon.broker.broker.Broker`` in this process (the
  peer: what ``halfmoon serve`` pays below gRPC);
- ``remote``: a real ``halfmoon broker`` process on loopback, through one
  ``RemoteBroker`` (blocking sends, coalesced on its send loop and carried
  to the broker's send listener).

Printed per row: messages per second, internal requests per send (how much
coalescing happened), CPU per message of the broker process and of this
process, from /proc. The issue's target: broker CPU per message ≤ 40 µs for
coalesced single-message sends.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.cluster_procs import BrokerServer
from bench.load import body, machine_info
from halfmoon.broker.broker import Broker as InProcessBroker
from halfmoon.broker.config import BrokerConfig
from halfmoon.broker.message import OutgoingMessage
from halfmoon.cluster.internal.remote_broker import RemoteBroker
from halfmoon.store.config import StoreConfig
from halfmoon.store.store import MessageStore

TOPIC = "BenchTopic"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU of a whole process (every thread), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclass
class Row:
    target: str
    threads: int
    messages: int
    seconds: float
    requests: int
    broker_cpu_s: float
    client_cpu_s: float

    def line(self) -> str:
        rate = self.messages / self.seconds
        per_request = self.messages / self.requests if self.requests else 0.0
        broker_us = self.broker_cpu_s / self.messages * 1e6
        client_us = self.client_cpu_s / self.messages * 1e6
        return (
            f"{self.target:<11} {self.threads:>7} {rate:>10,.0f} {per_request:>9.1f}"
            f" {broker_us:>13.1f} {client_us:>13.1f}"
        )


HEADER = (
    f"{'target':<11} {'threads':>7} {'msg/s':>10} {'msg/req':>9}"
    f" {'broker µs/msg':>13} {'client µs/msg':>13}"
)


def run_load(send: Callable[[list[OutgoingMessage]], object], threads: int, seconds: float) -> int:
    counts = [0] * threads
    stop = threading.Event()

    def worker(index: int) -> None:
        payload = body(index)
        while not stop.is_set():
            send([OutgoingMessage(TOPIC, payload)])
            counts[index] += 1

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    time.sleep(seconds)  # the measuring window itself, not a synchronisation
    stop.set()
    for thread in pool:
        thread.join()
    return sum(counts)


def bench_in_process(data_dir: Path, flush: str, threads: int, seconds: float) -> Row:
    store = MessageStore(StoreConfig(data_dir=data_dir, flush=flush))  # type: ignore[arg-type]
    broker = InProcessBroker(store, data_dir / "metadata", BrokerConfig())
    try:
        if broker.find_topic(TOPIC) is None:
            broker.create_topic(TOPIC, queue_count=8)
        run_load(broker.send, threads, 0.3)  # warm-up
        cpu, start = cpu_seconds(), time.monotonic()
        messages = run_load(broker.send, threads, seconds)
        elapsed, used = time.monotonic() - start, cpu_seconds() - cpu
        return Row("in-process", threads, messages, elapsed, messages, used, 0.0)
    finally:
        broker.close()
        store.close()


def bench_remote(flush: str, threads: int, seconds: float, in_flight: int) -> Row:
    broker = BrokerServer(flush=flush, name="bench").start()  # returns once it is ready
    try:
        remote = RemoteBroker(broker.address, timeout_s=30, max_in_flight_sends=in_flight)
        try:
            if remote.find_topic(TOPIC) is None:
                remote.create_topic(TOPIC, queue_count=8)
            run_load(remote.send, threads, 0.3)  # warm-up
            requests_before = remote.connection.call("send_stats")["requests"]
            broker_cpu, cpu, start = cpu_seconds(broker.pid), cpu_seconds(), time.monotonic()
            messages = run_load(remote.send, threads, seconds)
            elapsed = time.monotonic() - start
            return Row(
                "remote",
                threads,
                messages,
                elapsed,
                remote.connection.call("send_stats")["requests"] - requests_before,
                cpu_seconds(broker.pid) - broker_cpu,
                cpu_seconds() - cpu,
            )
        finally:
            remote.close()
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--threads", default="1,16,64")
    parser.add_argument("--flush", choices=("sync", "async"), default="sync")
    parser.add_argument("--in-flight", type=int, default=1, help="send requests in flight")
    args = parser.parse_args()
    print(
        f"# {machine_info()} flush={args.flush} seconds={args.seconds} in_flight={args.in_flight}"
    )
    print(HEADER)
    with tempfile.TemporaryDirectory(prefix="halfmoon-cluster-bench-") as tmp:
        for threads in (int(t) for t in args.threads.split(",")):
            local = bench_in_process(
                Path(tmp) / f"local-{threads}", args.flush, threads, args.seconds
            )
            print(local.line(), flush=True)
            remote = bench_remote(args.flush, threads, args.seconds, args.in_flight)
            print(remote.line(), flush=True)
            ratio = (remote.messages / remote.seconds) / (local.messages / local.seconds)
            print(f"{'':<11} {'':>7} remote/in-process throughput {ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()
