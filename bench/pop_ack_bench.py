"""Receive + ack throughput through a proxy against a sync broker group.

    PYTHONPATH=. .venv/bin/python -m bench.pop_ack_bench [--messages 3000] [--consumers 4]

etcd, a broker group of a master and two replicas (``sync``,
``--min-insync-replicas 1``) and a proxy, as real processes (the failover
tests' ``GroupCluster``). ``--messages`` messages are sent first; then
``--consumers`` official-client consumers each receive 32 at a time and ack
each message (one AckMessage per message, as the client does) until all are
consumed. Printed: messages received and acked per second. In a broker group
an ack answers once its ``%HM_POP%`` record is on the in-sync replicas
(``halfmoon/broker/pop_journal.py``).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

from tests.replication.group_cluster import GroupCluster, status, wait_for
from tests.replication.test_group_replication import message, producer

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--consumers", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        group = GroupCluster(Path(scratch) / "group", mode="sync", min_insync=1).start()
        try:
            wait_for(lambda: status(group.master)["isr"] == ["b1", "b2"], 15, "replicas in sync")
            assert group.proxy is not None
            group.proxy.create_topic("jobs", "normal", queues=4)
            group.proxy.create_group("workers", consume_from="earliest")
            sender = producer(group, "jobs")
            for i in range(args.messages):
                sender.send(message("jobs", i))
            sender.shutdown()
            config = ClientConfiguration(group.proxy.address, Credentials(), request_timeout=10)
            consumers = []
            for _ in range(args.consumers):
                made = SimpleConsumer(
                    config, "workers", {"jobs": FilterExpression()}, await_duration=1
                )
                made.startup()
                consumers.append(made)
            count = [0]
            ended: list[float] = []
            started = time.perf_counter()
            threads = [
                threading.Thread(target=consume, args=(c, args.messages, count, ended))
                for c in consumers
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for made in consumers:
                made.shutdown()
            if not ended:
                raise SystemExit(f"only {count[0]} of {args.messages} messages consumed")
            rate = count[0] / (ended[0] - started)
            print(f"{count[0]} messages, {args.consumers} consumers: {rate:.0f} msg/s")
        finally:
            group.kill()


if __name__ == "__main__":
    main()
