"""``halfmoon cluster list`` of a broker group, from real processes: the group's row shows
its disk, an uptime counted from the process's start, and the replication mode before any
replica has connected."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from halfmoon.process_start import process_started_ms
from tests.replication.group_cluster import CLUSTER, GroupCluster, running
from tests.replication.test_switchover import halfmoon


@pytest.fixture
def group(tmp_path: Path) -> Iterator[GroupCluster]:
    # A master alone: no replica ever connects, so the in-sync set is never published.
    with running(GroupCluster(tmp_path / "group", replicas=0, min_insync=0)) as cluster:
        yield cluster


def test_a_groups_row_shows_disk_uptime_and_mode(group: GroupCluster) -> None:
    args = ("cluster", "list", "--coordinator", group.etcd.url, "--cluster", CLUSTER)
    before_ms = time.time() * 1000
    listed = halfmoon(*args, "--json")
    after_ms = time.time() * 1000
    assert listed.returncode == 0, listed.stderr
    answer = json.loads(listed.stdout)
    [row] = [b for b in answer["brokers"] if b["name"] == "g1"]
    assert isinstance(row["disk_free_bytes"], int) and row["disk_free_bytes"] > 0, row
    assert 0 < row["disk_used_ratio"] < 1, row
    # Counted from the master's process start (the record's write time is later, and is
    # rewritten every 30 s).
    started_ms = process_started_ms(group.master.pid)
    assert before_ms - row["uptime_ms"] - 100 <= started_ms <= after_ms - row["uptime_ms"] + 100
    [listed_group] = answer["broker_groups"]
    assert listed_group["mode"] == "sync" and listed_group["isr"] == [], listed_group

    text = halfmoon(*args)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    broker_row = next(line for line in lines if re.match(r"broker\s+g1\s", line))
    assert re.search(r"\s[\d.]+ (GiB|MiB|KiB|B)\s+[\d.]+%\s", broker_row), broker_row
    assert re.search(r"\s\d+(ms|s|m\d*s?)\s*$", broker_row), broker_row  # UPTIME, last
    group_row = next(line for line in lines if line.startswith("g1 "))
    assert group_row.split()[:4] == ["g1", "b0", "1", "sync"], group_row
