"""What the dashboard's pages cost a broker with 1,000 topics and 1,000 groups.

Each page is the set of admin API requests its script makes (dashboard.js); the
peer is the same page without server-side search and paging, fetching the whole
topic or group list as a page without them would. A real ``halfmoon serve`` on
loopback; wall time per page load (median and p90 of ``--rounds`` loads) and the
server's CPU per load from /proc.

Every tenth topic holds a message, and ``--consuming`` of the groups have each received
and acked one (through the gRPC client), so the statistics the pages read have rows for
messages in and out, and lags to compute.

    .venv/bin/python -m bench.dashboard_bench [--topics 1000] [--groups 1000] [--consuming 200]
                                              [--rounds 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from bench.cluster_bench import cpu_seconds
from bench.server_proc import HalfmoonServer
from halfmoon.client.selector import MessageSelector
from halfmoon.client.sync import SyncSimpleConsumer

# The lists need rates and lags, not the overview chart's per-minute counts.
STATS_FOR_LISTS = "/v1/statistics?last_hour=false"
PAGES: dict[str, Sequence[str]] = {
    # overviewPage: six requests in parallel
    "overview": (
        "/v1/broker/status",
        "/v1/cluster",
        "/v1/statistics",
        "/v1/transactions?limit=1000",
        "/v1/config",
        "/v1/dead-letters",
    ),
    # topicsPage: the page of topics, and rates and backlog from the statistics
    "topics (page of 50)": ("/v1/topics?search=&offset=0&limit=50", STATS_FOR_LISTS),
    "topics (search)": ("/v1/topics?search=t-0999&offset=0&limit=50", STATS_FOR_LISTS),
    # groupsPage: the page of groups, lag from the statistics, dead letters per group
    "groups (page of 50)": (
        "/v1/groups?search=&offset=0&limit=50",
        STATS_FOR_LISTS,
        "/v1/dead-letters",
    ),
    # peers: the whole list, as a page without server-side paging would fetch it
    "topics (whole list)": ("/v1/topics", STATS_FOR_LISTS),
    "groups (whole list)": ("/v1/groups", STATS_FOR_LISTS, "/v1/dead-letters"),
}


def post(base: str, path: str, body: dict) -> None:
    request = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30):
        pass


def fetch(base: str, path: str) -> int:
    with urllib.request.urlopen(base + path, timeout=30) as response:
        return len(response.read())


def load_page(pool: ThreadPoolExecutor, base: str, paths: Sequence[str]) -> int:
    return sum(pool.map(lambda p: fetch(base, p), paths))


def consume_one(address: str, group: str, topic: str) -> None:
    """``group`` receives and acks the one message of ``topic``."""
    with SyncSimpleConsumer(address, group, {topic: MessageSelector.all()}) as consumer:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = consumer.receive(1, 30, wait=1)
            if got:
                consumer.ack(got[0])
                return
    raise RuntimeError(f"{group} received nothing from {topic}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--consuming", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    with HalfmoonServer(flush="async") as server, ThreadPoolExecutor(6) as pool:
        base = server.admin
        for i in range(args.topics):
            post(base, "/v1/topics", {"name": f"t-{i:04d}", "queue_count": 1})
        for i in range(args.groups):
            post(base, "/v1/groups", {"name": f"g-{i:04d}"})
        sent = [f"t-{i:04d}" for i in range(0, args.topics, 10)]
        for topic in sent:
            post(base, f"/v1/topics/{topic}/messages", {"body": "x"})
        for i in range(min(args.consuming, args.groups)):
            consume_one(server.grpc, f"g-{i:04d}", sent[i % len(sent)])
        print(
            f"{args.topics} topics, {args.groups} groups ({args.consuming} consuming), "
            f"{args.rounds} loads per page\n"
        )
        print(f"{'page':<22} {'median ms':>10} {'p90 ms':>8} {'KiB':>7} {'server CPU ms':>14}")
        medians: dict[str, float] = {}
        for name, paths in PAGES.items():
            load_page(pool, base, paths)  # warm up
            times = []
            cpu_before = cpu_seconds(server.pid)
            for _ in range(args.rounds):
                started = time.perf_counter()
                size = load_page(pool, base, paths)
                times.append((time.perf_counter() - started) * 1000)
            cpu = (cpu_seconds(server.pid) - cpu_before) * 1000 / args.rounds
            times.sort()
            medians[name] = statistics.median(times)
            p90 = times[int(len(times) * 0.9) - 1]
            print(f"{name:<22} {medians[name]:>10.1f} {p90:>8.1f} {size / 1024:>7.1f} {cpu:>14.1f}")
        print()
        for paged, whole in [
            ("topics (page of 50)", "topics (whole list)"),
            ("groups (page of 50)", "groups (whole list)"),
        ]:
            print(f"{whole} / {paged}: {medians[whole] / medians[paged]:.2f}x the time")


if __name__ == "__main__":
    main()
