"""What deciding a transaction group costs when its members span brokers.

    .venv/bin/python -m bench.txn_group_bench [--groups 30] [--members 10,100]

Per row, ``--groups`` groups of 2 x M half messages are sent, then each is
committed with ``end_transaction_group`` and its latency measured:

- ``one broker``: a ``halfmoon broker`` process outside any cluster, every
  member on it (the decision of local mode, one network hop away);
- ``two brokers``: two ``halfmoon broker`` processes of one cluster with a
  real etcd, M members on each, the decision sent to the participant (it
  reads the coordinator from etcd, forwards, the coordinator decides, then
  tells the participant): the path of ``docs/cluster.md``.

Printed: p50 and p99 decision latency, and the brokers' CPU per decision
from /proc. Needs ``etcd`` on the PATH (``./run test`` installs it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.cluster_bench import cpu_seconds
from bench.load import machine_info
from bench.server_proc import free_port
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.cluster.internal.remote_broker import RemoteBroker
from halfmoon.cluster.internal.txn_groups import coordinator_for

TOPIC = "bench-txn-groups"


def start_etcd(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("etcd")
    if binary is None:
        sys.exit("etcd is not installed (./run test installs Debian's etcd-server)")
    client, peer = f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [binary, "--name=bench", f"--data-dir={data_dir}",
         f"--listen-client-urls=http://{client}", f"--advertise-client-urls=http://{client}",
         f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
         f"--initial-cluster=bench={peer}", "--log-level=warn"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            request = urllib.request.Request(
                f"http://{client}/v3/kv/range", data=json.dumps({"key": "AA=="}).encode()
            )
            with urllib.request.urlopen(request, timeout=1):
                return process, f"etcd://{client}"
        except OSError:
            time.sleep(0.1)
    process.kill()
    sys.exit("etcd did not start")


def start_broker(
    data_dir: Path, name: str, cluster: list[str]
) -> tuple[subprocess.Popen[bytes], str]:
    address = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [sys.executable, "-m", "halfmoon", "broker", "--name", name, "--data-dir", str(data_dir),
         "--listen", address, "--flush", "sync", *cluster],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return process, address


def members(group: str, count: int) -> list[OutgoingMessage]:
    return [
        OutgoingMessage(
            TOPIC,
            b"x" * 1024,
            message_type=MessageType.TRANSACTION,
            producer_group="bench",
            transaction_group=group,
        )
        for _ in range(count)
    ]


def run(
    label: str, remotes: list[RemoteBroker], pids: list[int], groups: list[str], size: int
) -> None:
    for remote in remotes:
        if remote.find_topic(TOPIC) is None:
            remote.create_topic(TOPIC, MessageType.TRANSACTION, queue_count=4)
    for group in groups:  # M members on each broker (2 x M on a lone broker)
        for remote in remotes:
            remote.send(members(group, size * 2 // len(remotes)))
    latencies = []
    cpu_before = sum(cpu_seconds(pid) for pid in pids)
    for group in groups:
        start = time.perf_counter()
        decided = remotes[-1].end_transaction_group(group, "commit")
        latencies.append(time.perf_counter() - start)
        assert decided == 2 * size, (decided, 2 * size)
    cpu = sum(cpu_seconds(pid) for pid in pids) - cpu_before
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    print(
        f"{label:<12} {2 * size:>8} {statistics.median(latencies) * 1000:>9.1f} "
        f"{p99 * 1000:>9.1f} {cpu / len(groups) * 1000:>14.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=30)
    parser.add_argument("--members", default="10,100", help="members per broker (M)")
    args = parser.parse_args()
    sizes = [int(n) for n in args.members.split(",")]
    print(machine_info())
    print(f"{'target':<12} {'members':>8} {'p50 ms':>9} {'p99 ms':>9} {'broker CPU ms':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        etcd, url = start_etcd(root / "etcd")
        processes: list[subprocess.Popen[bytes]] = [etcd]
        try:
            lone, lone_address = start_broker(root / "lone", "lone", [])
            processes.append(lone)
            cluster = ["--cluster", "bench", "--coordinator", url]
            started = [start_broker(root / n, n, cluster) for n in ("broker-a", "broker-b")]
            processes += [p for p, _ in started]
            lone_remote = RemoteBroker(lone_address, timeout_s=60)
            pair = [RemoteBroker(address, timeout_s=60) for _, address in started]
            for size in sizes:
                run(
                    "one broker",
                    [lone_remote],
                    [lone.pid],
                    [f"lone-{size}-{i}" for i in range(args.groups)],
                    size,
                )
                # Decided through broker-b, coordinated by broker-a: the forwarding path.
                names = ["broker-a", "broker-b"]
                groups = [
                    g
                    for g in (f"pair-{size}-{i}" for i in range(args.groups * 4))
                    if coordinator_for(g, names) == "broker-a"
                ][: args.groups]
                run("two brokers", pair, [p.pid for p, _ in started], groups, size)
            for remote in [lone_remote, *pair]:
                remote.close()
        finally:
            for process in reversed(processes):
                process.terminate()
                process.wait(timeout=30)


if __name__ == "__main__":
    main()
