"""Failover time: from a master's SIGKILL to the first send acknowledged through the proxy.

    .venv/bin/python -m bench.failover_bench [--kills 20] [--lease-ttl S] [--senders 2]
        [--switchovers N]

A broker group in etcd (a master and two replicas, ``--replication sync
--min-insync-replicas 1``, flush sync; the group's lease and every other
replication setting at their defaults unless ``--lease-ttl`` is given) behind one
``halfmoon proxy``; ``--senders`` threads send without pause through the proxy
with the official Python client (``rocketmq``). Each round:

1. wait until the group's master has both replicas in its in-sync set;
2. SIGKILL the master, note the time;
3. wait for the first send acknowledged after it (the controller sees the
   lease expire, appoints the most caught-up in-sync replica, which opens its
   broker; the proxy follows the routing entry; the client retries);
4. restart the killed member on an emptied data directory (a returning master
   is not truncated yet, so it copies the new master's log from zero) and let
   it rejoin.

Printed: each round's time and where it went, on one clock (etcd's changes
as a watch sees them, the processes' log lines): ``expired`` when etcd
deleted the dead master's key (its lease ran out), ``appointed`` when a
controller wrote the new one, ``announced`` when the new master wrote the
group's routing entry (once it serves), ``in-sync`` when it first published
an in-sync set (a replica following it: before, it takes no sync write),
``connected`` when the proxy had
connected to it, then the first acknowledged send; then min / p50 / p90 /
max over the rounds, and how many tracebacks the proxy logged (there should
be none). The floor is the lease (etcd must expire the dead master's key);
the rest is the controller's reaction, the appointed replica opening its
broker, the proxy following the routing entry and the client's retry.

``--switchovers N`` then runs N planned switchovers (``halfmoon cluster
failover G``, no target: the most caught-up in-sync replica) under the same
load, each once both replicas are in the master's in-sync set, and prints for
each the command's time and the clients' pause: the longest gap between
consecutive acknowledged sends (of all senders together) from the last one
before the command to the first one after it answered; then the pauses' min /
p50 / p90 / max.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.cluster_procs import ProxyServer
from bench.failover_timeline import KeyTimeline, logged_at
from bench.load import machine_info, percentile
from bench.replication_bench import READY, etcd, replication_status
from bench.server_proc import REPO_ROOT, free_port

CLUSTER = "failover-bench"
GROUP = "g1"
TOPIC = "FailoverBench"
MEMBERS = 3
ROUND_TIMEOUT_S = 60.0


@dataclass
class Member:
    name: str
    data_dir: Path
    port: int
    flags: tuple[str, ...]
    proc: subprocess.Popen[str] | None = None
    lines: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "halfmoon", "broker", "--name", self.name,
             "--data-dir", str(self.data_dir), "--listen", self.address, "--flush", "sync",
             *self.flags],
            cwd=REPO_ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        ready = threading.Event()

        def drain(stream: Any) -> None:  # reads on, so a chatty broker never blocks
            for line in stream:
                self.lines.append(line)
                del self.lines[:-2000]
                if READY.search(line):
                    ready.set()
            ready.set()

        threading.Thread(target=drain, args=(self.proc.stderr,), daemon=True).start()
        if not ready.wait(30) or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} did not start:\n{''.join(self.lines[-30:])}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def role(member: Member) -> dict[str, Any] | None:
    try:
        return replication_status(member.address)
    except Exception:  # noqa: BLE001 - starting, stopping or dead
        return None


def wait_for(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)  # polling the processes' state, with a deadline


def healthy_master(members: list[Member]) -> Member | None:
    """The master, once both replicas are in its in-sync set."""
    for member in members:
        status = role(member)
        if status and status.get("role") == "master" and len(status.get("isr", [])) == 2:
            return member
    return None


class Senders:
    """Threads sending through the proxy with the official client; when each send was acked."""

    def __init__(self, proxy: str, count: int) -> None:
        self.proxy = proxy
        self.acked: list[float] = []
        self.failed = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(count)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)

    def run(self, index: int) -> None:
        from rocketmq import ClientConfiguration, Credentials, Message, Producer

        producer = Producer(
            ClientConfiguration(self.proxy, Credentials(), request_timeout=3), (TOPIC,)
        )
        producer.startup()
        try:
            sent = 0
            while not self.stop.is_set():
                message = Message()
                message.topic = TOPIC
                message.body = f"{index}-{sent}".encode()
                sent += 1
                try:
                    producer.send(message)
                except Exception:  # noqa: BLE001 - not acknowledged: the client gave up
                    with self.lock:
                        self.failed += 1
                    self.stop.wait(0.05)  # keeps a refused sender from spinning
                    continue
                with self.lock:
                    self.acked.append(time.monotonic())
        finally:
            producer.shutdown()

    def first_after(self, moment: float) -> float | None:
        with self.lock:
            later = [t for t in self.acked[-1000:] if t > moment]
        return min(later) if later else None

    def longest_gap(self, start: float, end: float) -> float:
        """The longest gap between consecutive acknowledgements from the last one before
        ``start`` through the first one at or after ``end``."""
        with self.lock:
            times = sorted(self.acked)
        before = [t for t in times if t < start][-1:]
        between = [t for t in times if start <= t < end]
        after = [t for t in times if t >= end][:1]
        window = before + between + after
        return max((b - a for a, b in zip(window, window[1:], strict=False)), default=0.0)


def switchover(coordinator: str) -> tuple[float, float, dict[str, Any]]:
    """A planned switchover through etcd: when asked, when answered, the answer."""
    asked = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "halfmoon", "cluster", "failover", GROUP,
         "--coordinator", coordinator, "--cluster", CLUSTER, "--json"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    answered = time.monotonic()
    if done.returncode != 0:
        raise RuntimeError(f"cluster failover failed: {done.stderr.strip()}")
    return asked, answered, json.loads(done.stdout)


@dataclass
class Round:
    """One kill: seconds from it to each step (None: not seen), and to the first ack."""

    expired: float | None
    appointed: float | None
    announced: float | None
    in_sync: float | None
    connected: float | None
    first_ack: float

    def line(self) -> str:
        def at(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}"

        return (
            f"expired {at(self.expired)} appointed {at(self.appointed)} "
            f"announced {at(self.announced)} in-sync {at(self.in_sync)} "
            f"connected {at(self.connected)} "
            f"first ack {self.first_ack:.2f}s"
        )


def timed_round(
    timeline: KeyTimeline, proxy: ProxyServer, killed_wall: float, first_ack: float
) -> Round:
    def since(value: float | None) -> float | None:
        return None if value is None else value - killed_wall

    master_key = f"broker-groups/{GROUP}/master"
    appointed = timeline.first_after(killed_wall, "PUT", master_key)
    return Round(
        since(timeline.first_after(killed_wall, "DELETE", master_key)),
        since(appointed),
        since(timeline.first_after(killed_wall, "PUT", f"brokers/{GROUP}")),
        since(timeline.first_after(appointed or killed_wall, "PUT", f"broker-groups/{GROUP}/isr")),
        since(logged_at(proxy.lines, f"event=broker_connected broker={GROUP} ", killed_wall)),
        first_ack,
    )


def run(
    kills: int,
    lease_ttl: int | None,
    senders_count: int,
    root: Path,
    switchovers: int = 0,
) -> tuple[list[Round], list[float], int]:
    """The failover rounds of ``kills``, the clients' pauses of ``switchovers``, and how many
    tracebacks the proxy logged."""
    with etcd(root) as coordinator:
        flags = (
            "--cluster", CLUSTER, "--coordinator", coordinator, "--group", GROUP,
            "--replication", "sync", "--min-insync-replicas", "1",
            *(("--lease-ttl", str(lease_ttl)) if lease_ttl is not None else ()),
            "--set", "store.segment_size=1048576",
        )  # fmt: skip
        members = [Member(f"b{i}", root / f"b{i}", free_port(), flags) for i in range(MEMBERS)]
        proxy = ProxyServer(None, cluster=("--cluster", CLUSTER, "--coordinator", coordinator))  # type: ignore[arg-type]
        proxy.settings = ("store.segment_size=1048576",)
        timeline = KeyTimeline(coordinator, f"/halfmoon/{CLUSTER}/").start()
        senders: Senders | None = None
        rounds: list[Round] = []
        try:
            for member in members:  # in order: the first is the master
                member.start()
            wait_for(lambda: healthy_master(members), 30, "both replicas in sync")
            proxy.start()
            proxy.create_topic(TOPIC, queues=4)
            senders = Senders(proxy.grpc, senders_count)
            senders.start()
            wait_for(lambda: len(senders.acked) >= 50, 60, "sends acknowledged")
            for round_ in range(kills):
                master = wait_for(lambda: healthy_master(members), ROUND_TIMEOUT_S, "a master")
                killed_wall = time.time()
                master.kill()
                killed = time.monotonic()
                first = wait_for(
                    lambda at=killed: senders.first_after(at),
                    ROUND_TIMEOUT_S,
                    "a send acknowledged",
                )
                rounds.append(timed_round(timeline, proxy, killed_wall, first - killed))
                print(f"kill {round_ + 1:>2}: {master.name} → {rounds[-1].line()}", flush=True)
                shutil.rmtree(master.data_dir)
                master.start()
            pauses: list[float] = []
            for round_ in range(switchovers):
                master = wait_for(lambda: healthy_master(members), ROUND_TIMEOUT_S, "a master")
                asked, answered, outcome = switchover(coordinator)
                wait_for(
                    lambda at=answered: senders.first_after(at),
                    ROUND_TIMEOUT_S,
                    "a send acknowledged after the switchover",
                )
                pause = senders.longest_gap(asked, answered)
                pauses.append(pause)
                print(f"switchover {round_ + 1:>2}: {master.name} → {outcome.get('master')} "
                      f"command {answered - asked:.2f}s, clients paused {pause:.2f}s, "
                      f"fenced {outcome.get('fenced_ms')} ms", flush=True)  # fmt: skip
            tracebacks = sum("Traceback (most recent call last)" in line for line in proxy.lines)
            return rounds, pauses, tracebacks
        finally:
            if senders is not None:
                senders.close()
            timeline.close()
            proxy.stop()
            for member in members:
                member.stop()


def summary(name: str, values: list[float], count: str) -> str:
    ordered = sorted(values)
    return (
        f"{name} min={ordered[0]:.2f} p50={percentile(ordered, 0.5):.2f} "
        f"p90={percentile(ordered, 0.9):.2f} max={ordered[-1]:.2f} {count}={len(values)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument(
        "--lease-ttl", type=int, default=None, help="the members' --lease-ttl (default: theirs)"
    )
    parser.add_argument("--senders", type=int, default=2)
    parser.add_argument("--switchovers", type=int, default=0)
    args = parser.parse_args()
    ttl = "default" if args.lease_ttl is None else f"{args.lease_ttl}s"
    print(f"# {json.dumps(machine_info())} kills={args.kills} lease_ttl={ttl} "
          f"senders={args.senders} switchovers={args.switchovers}", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="halfmoon-failover-bench-") as tmp:
        rounds, pauses, tracebacks = run(
            args.kills, args.lease_ttl, args.senders, Path(tmp), args.switchovers
        )
    if rounds:
        print(summary("failover_s", [r.first_ack for r in rounds], "kills"))
        for step in ("expired", "appointed", "announced", "in_sync", "connected"):
            seen = [v for r in rounds if (v := getattr(r, step)) is not None]
            if seen:
                print(summary(f"  {step}_s", seen, "seen"))
    if pauses:
        print(summary("pause_s", pauses, "switchovers"))
    print(f"proxy_tracebacks={tracebacks}")


if __name__ == "__main__":
    main()
