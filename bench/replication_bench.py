"""Sends to a broker group under sync replication (1 and 2 replicas) vs an unreplicated broker.

    .venv/bin/python -m bench.replication_bench [--seconds 3] [--threads 16] [--batches 1,32]

For each batch size, the same load (``--threads`` threads, each sending one
batch of 1 KiB messages at a time through ``RemoteBroker``, waiting for the
answer) runs against:

- ``none``: one ``halfmoon broker`` (flush sync), no group: the peer;
- ``sync-1``: a group in etcd of a master and 1 replica, ``--replication sync
  --min-insync-replicas 1``;
- ``sync-2``: a master and 2 replicas, ``--min-insync-replicas 2``.

Every broker flushes with fsync (``--flush sync``), so a sync-replicated send is
on the disk of the master and of every in-sync replica before it is answered.
Printed per row: messages per second, p99 latency of a send call, CPU per
message of the master and of all replicas together (from /proc), and the
throughput relative to ``none`` at the same batch size (the issue's target:
≥ 0.6 with batches of 32). All processes share this machine: on a small one
the replicas' CPU competes with the master's.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.cluster_bench import cpu_seconds
from bench.load import body, machine_info, percentile
from bench.server_proc import free_port
from halfmoon.broker.message import OutgoingMessage
from halfmoon.cluster.internal.remote_broker import RemoteBroker

TOPIC = "BenchTopic"
READY = re.compile(r"halfmoon broker ready .*internal=(\S+)")


@dataclass
class Row:
    target: str
    batch: int
    messages: int
    seconds: float
    p99_ms: float
    master_cpu_s: float
    replicas_cpu_s: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    def line(self, peer: float) -> str:
        return (
            f"{self.target:<7} {self.batch:>5} {self.rate:>10,.0f} {self.p99_ms:>8.1f}"
            f" {self.master_cpu_s / self.messages * 1e6:>13.1f}"
            f" {self.replicas_cpu_s / self.messages * 1e6:>15.1f} {self.rate / peer:>8.2f}"
        )


HEADER = (
    f"{'target':<7} {'batch':>5} {'msg/s':>10} {'p99 ms':>8} {'master µs/msg':>13}"
    f" {'replicas µs/msg':>15} {'vs none':>8}"
)


@contextmanager
def etcd(root: Path) -> Iterator[str]:
    client, peer = free_port(), free_port()
    url = f"http://127.0.0.1:{client}"
    process = subprocess.Popen(
        [shutil.which("etcd") or "etcd", "--data-dir", str(root / "etcd"),
         "--listen-client-urls", url, "--advertise-client-urls", url,
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"default=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("etcd did not start") from None
                time.sleep(0.1)  # polling a child's start, not synchronising the measurement
        yield f"etcd://127.0.0.1:{client}"
    finally:
        process.terminate()
        process.wait(30)


# Each broker's last log lines, by pid: shown when one does not stop when asked.
LOG_TAILS: dict[int, collections.deque[str]] = {}
STOP_TIMEOUT_S = 30.0


def start_broker(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "halfmoon", "broker", "--listen", "127.0.0.1:0",
         "--flush", "sync", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stderr is not None
    tail = LOG_TAILS.setdefault(process.pid, collections.deque(maxlen=40))
    for line in process.stderr:
        tail.append(line)
        found = READY.search(line)
        if found:
            threading.Thread(target=drain, args=(process.stderr, tail), daemon=True).start()
            return process, found.group(1)
    raise RuntimeError("a broker did not start:\n" + "".join(tail))


def drain(stream: Iterator[str], tail: collections.deque[str]) -> None:
    """Read a child's log to its end, so its pipe never fills; keep its last lines."""
    for line in stream:
        tail.append(line)


def stop_brokers(processes: list[subprocess.Popen[str]]) -> None:
    """SIGTERM each broker; one still running after STOP_TIMEOUT_S is SIGKILLed and reported
    (with its last log lines) on stderr, and the measurement already taken is kept."""
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in processes:
        try:
            process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
            tail = "".join(LOG_TAILS.get(process.pid, ()))
            print(
                f"# warning: broker pid {process.pid} ({' '.join(process.args[3:])}) did not "
                f"stop within {STOP_TIMEOUT_S:.0f} s of SIGTERM; killed. Its last lines:\n{tail}",
                file=sys.stderr,
                flush=True,
            )


def replication_status(address: str) -> dict[str, object]:
    import grpc

    from halfmoon.replication import protocol

    with grpc.insecure_channel(address) as channel:
        answer = channel.unary_unary(protocol.STATUS)(protocol.encode({}), timeout=5)
    return protocol.decode(answer)


def run_load(remote: RemoteBroker, threads: int, batch: int, seconds: float) -> tuple[int, float]:
    counts = [0] * threads
    latencies: list[list[float]] = [[] for _ in range(threads)]
    stop = threading.Event()

    def worker(index: int) -> None:
        messages = [OutgoingMessage(TOPIC, body(index * 1000 + i)) for i in range(batch)]
        while not stop.is_set():
            started = time.monotonic()
            remote.send(messages)
            latencies[index].append(time.monotonic() - started)
            counts[index] += batch

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    time.sleep(seconds)  # the measuring window itself, not a synchronisation
    stop.set()
    for thread in pool:
        thread.join()
    samples = [s for per in latencies for s in per]
    return sum(counts), percentile(samples, 0.99) * 1000


def measure(
    target: str, master: str, pids: list[int], threads: int, batch: int, seconds: float
) -> Row:
    remote = RemoteBroker(master, timeout_s=30)
    try:
        if remote.find_topic(TOPIC) is None:
            remote.create_topic(TOPIC, queue_count=8)
        run_load(remote, threads, batch, 0.5)  # warm-up
        before = [cpu_seconds(pid) for pid in pids]
        start = time.monotonic()
        messages, p99 = run_load(remote, threads, batch, seconds)
        elapsed = time.monotonic() - start
        used = [cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True)]
        return Row(target, batch, messages, elapsed, p99, used[0], sum(used[1:]))
    finally:
        remote.close()


def bench_target(
    root: Path, coordinator: str, replicas: int, threads: int, batch: int, seconds: float
) -> Row:
    processes: list[subprocess.Popen[str]] = []
    try:
        if replicas == 0:
            process, master = start_broker(["--name", "solo", "--data-dir", str(root / "solo")])
            processes.append(process)
        else:
            cluster = f"bench{replicas}b{batch}"
            group = ["--cluster", cluster, "--coordinator", coordinator, "--group", "g",
                     "--replication", "sync", "--min-insync-replicas", str(replicas)]  # fmt: skip
            master = ""
            for i in range(replicas + 1):
                process, address = start_broker(
                    [*group, "--name", f"m{i}", "--data-dir", str(root / f"{cluster}-{i}")]
                )
                processes.append(process)
                master = master or address
            deadline = time.monotonic() + 30
            while len(replication_status(master)["isr"]) < replicas:  # type: ignore[arg-type]
                if time.monotonic() > deadline:
                    raise RuntimeError("the replicas did not join the in-sync set")
                time.sleep(0.1)  # polling the group's start, not synchronising the measurement
        target = "none" if replicas == 0 else f"sync-{replicas}"
        return measure(target, master, [p.pid for p in processes], threads, batch, seconds)
    finally:
        stop_brokers(processes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--batches", default="1,32")
    args = parser.parse_args()
    print(f"# {json.dumps(machine_info())} threads={args.threads} seconds={args.seconds}")
    print(HEADER)
    with tempfile.TemporaryDirectory(prefix="halfmoon-replication-bench-") as tmp:
        root = Path(tmp)
        with etcd(root) as coordinator:
            for batch in (int(b) for b in args.batches.split(",")):
                peer = bench_target(root, coordinator, 0, args.threads, batch, args.seconds)
                print(peer.line(peer.rate), flush=True)
                for replicas in (1, 2):
                    row = bench_target(
                        root, coordinator, replicas, args.threads, batch, args.seconds
                    )
                    print(row.line(peer.rate), flush=True)


if __name__ == "__main__":
    main()
