"""Receive + ack throughput: ``halfmoon serve`` (sync flush) or a sync broker group.

    PYTHONPATH=. .venv/bin/python -m bench.pop_ack_bench [--mode serve|group]
        [--messages 3000] [--consumers 4]

``--mode serve``: one ``halfmoon serve --flush sync`` process (the local
default). ``--mode group`` (the default): etcd, a broker group of a master and
two replicas (``sync``, ``--min-insync-replicas 1``) and a proxy, as real
processes (the failover tests' ``GroupCluster``). ``--messages`` messages are
sent first; then ``--consumers`` official-client consumers each receive 32 at
a time and ack each message (one AckMessage per message, as the client does)
until all are consumed. Printed: messages received and acked per second, and
(serve) the server's CPU per message over the consuming phase. An ack answers
once its ``%HM_POP%`` record is durable (``halfmoon/broker/pop_journal.py``):
after the fsync covering it under sync flush, in a broker group once the
in-sync replicas hold it. Compare two trees by alternating runs.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer

from bench.cluster_bench import cpu_seconds
from bench.server_proc import HalfmoonServer
from tests.replication.group_cluster import GroupCluster, status
from tests.replication.test_group_replication import message, producer
from tests.waiting import wait_until

_lock = threading.Lock()


def consume(consumer: SimpleConsumer, wanted: int, count: list[int], ended: list[float]) -> None:
    misses = 0
    while misses < 2:  # two empty long polls (1 s each): nothing is left
        got = consumer.receive(32, 30)
        if not got:
            misses += 1
            continue
        misses = 0
        for msg in got:
            consumer.ack(msg)
        with _lock:
            count[0] += len(got)
            if count[0] >= wanted and not ended:
                ended.append(time.perf_counter())


def consume_all(address: str, messages: int, consumers: int) -> tuple[int, float]:
    """Receive and ack ``messages`` with ``consumers`` threads: (count, seconds)."""
    config = ClientConfiguration(address, Credentials(), request_timeout=10)
    made_consumers = []
    for _ in range(consumers):
        made = SimpleConsumer(config, "workers", {"jobs": FilterExpression()}, await_duration=1)
        made.startup()
        made_consumers.append(made)
    count = [0]
    ended: list[float] = []
    started = time.perf_counter()
    threads = [
        threading.Thread(target=consume, args=(c, messages, count, ended)) for c in made_consumers
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for made in made_consumers:
        made.shutdown()
    if not ended:
        raise SystemExit(f"only {count[0]} of {messages} messages consumed")
    return count[0], ended[0] - started


def send_all(address: str, messages: int) -> None:
    config = ClientConfiguration(address, Credentials(), request_timeout=10)
    sender = Producer(config, ("jobs",))
    sender.startup()
    for i in range(messages):
        sender.send(message("jobs", i))
    sender.shutdown()


def run_serve(args: argparse.Namespace) -> None:
    with HalfmoonServer(flush="sync") as server:
        server.create_topic("jobs", queues=4)
        server.create_group("workers", consume_from="earliest")
        send_all(server.grpc, args.messages)
        cpu_before = cpu_seconds(server.pid)
        count, seconds = consume_all(server.grpc, args.messages, args.consumers)
        cpu = cpu_seconds(server.pid) - cpu_before
        print(
            f"serve --flush sync: {count} messages, {args.consumers} consumers: "
            f"{count / seconds:.0f} msg/s, server CPU {cpu / count * 1e6:.0f} us/msg "
            "(receive + ack, consuming phase)"
        )


def run_group(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        group = GroupCluster(Path(scratch) / "group", mode="sync", min_insync=1).start()
        try:
            wait_until(lambda: status(group.master)["isr"] == ["b1", "b2"], 15, "replicas in sync")
            assert group.proxy is not None
            group.proxy.create_topic("jobs", "normal", queues=4)
            group.proxy.create_group("workers", consume_from="earliest")
            sender = producer(group, "jobs")
            for i in range(args.messages):
                sender.send(message("jobs", i))
            sender.shutdown()
            count, seconds = consume_all(group.proxy.address, args.messages, args.consumers)
            print(
                f"group: {count} messages, {args.consumers} consumers: {count / seconds:.0f} msg/s"
            )
        finally:
            group.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("serve", "group"), default="group")
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--consumers", type=int, default=4)
    args = parser.parse_args()
    if args.mode == "serve":
        run_serve(args)
    else:
        run_group(args)


if __name__ == "__main__":
    main()
