"""Automatic failover with real processes: etcd, a master and two replicas, a proxy.

Sync replication (``min_insync_replicas=1``), the group's lease and every
other replication setting at their defaults, the official Python client
sending from several threads through the proxy. The master is SIGKILLed and
its data directory deleted; a controller (run by every member) sees its lease
expire and appoints the in-sync replica whose log ends furthest, in a new
epoch; that replica opens its broker and announces itself, the other follows
it, and the proxy routes to it. Checked: a send is acknowledged by the new
master within 5 s of the kill, the new master answers the moment it is
announced, the proxy logs no traceback, every acknowledged message is
delivered afterwards, and no message that was never acknowledged is
delivered twice. A master stalled for less than the default lease tolerates
(SIGSTOP, then SIGCONT) is not replaced.
"""

from __future__ import annotations

import collections
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from halfmoon.config import replication_defaults as defaults
from tests.replication.announcements import AnnouncementProbe
from tests.replication.group_cluster import (
    CLUSTER,
    GROUP,
    GroupCluster,
    acting_master,
    receive_all,
    role,
    running,
    status,
)
from tests.replication.send_load import SendLoad
from tests.replication.test_group_replication import message, producer
from tests.waiting import wait_until

SENDERS = 8  # official-client producer threads sending without pause
ETCD_EXPIRY_SCAN_S = 0.5  # etcd 3.4 revokes expired leases on a scan this often


@pytest.fixture
def group(tmp_path: Path) -> Iterator[GroupCluster]:
    with running(GroupCluster(tmp_path / "group", mode="sync", min_insync=1)) as cluster:
        yield cluster


def test_a_killed_master_is_replaced_within_5_s_and_no_acknowledged_message_is_lost(
    group: GroupCluster,
) -> None:
    wait_until(lambda: status(group.master)["isr"] == ["b1", "b2"], 15, "both replicas in sync")
    assert group.proxy is not None
    group.proxy.create_topic("orders", "normal", queues=2)
    group.proxy.create_group("readers")
    probe = AnnouncementProbe(group.etcd.url, CLUSTER, GROUP)
    with probe, SendLoad(group, SENDERS) as load:
        wait_until(lambda: len(load.acked) >= 100, 60, "100 acknowledged sends before the kill")
        logged_before = len(group.proxy.lines)
        group.master.kill()
        killed = time.monotonic()
        shutil.rmtree(group.master.data_dir)
        new_master = wait_until(
            lambda: acting_master(group),
            15,
            "a replica to take office",
        )
        wait_until(
            lambda: any(t > killed for t in list(load.acked_at)), 20, "a send acknowledged after"
        )
        first_after = min(t for t in list(load.acked_at) if t > killed)
        assert first_after - killed < 5.0, f"first acknowledged send {first_after - killed:.1f}s"
        count_after = len(load.acked)
        wait_until(
            lambda: len(load.acked) >= count_after + 50, 30, "50 more sends to the new master"
        )
    assert status(new_master)["epoch"] == 2
    # Announced once it serves: the first call, made the moment etcd named it, was answered.
    assert probe.answers and probe.answers[0] == (2, None), probe.answers
    # The old master's connection closed, the new one's opened: nothing unhandled on the way.
    since_kill = group.proxy.lines[logged_before:]
    tracebacks = [i for i, line in enumerate(since_kill) if line.startswith("Traceback")]
    assert not tracebacks, "\n".join(since_kill[tracebacks[0] - 2 : tracebacks[0] + 20])
    other = next(b for b in group.replicas if b is not new_master)
    wait_until(lambda: status(other)["master"] == new_master.name, 10, "the other to follow")

    delivered = receive_all(group.proxy.address, len(load.acked), timeout=60)
    counts = collections.Counter(delivered)
    missing = load.acked - counts.keys()
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
    twice = {body for body, n in counts.items() if n > 1 and body in load.failed - load.acked}
    assert not twice, f"never acknowledged yet delivered twice: {sorted(twice)[:5]}"
    print(
        f"acked={len(load.acked)} failed={len(load.failed)} delivered={len(delivered)} "
        f"failover_s={first_after - killed:.2f} new_master={new_master.name}"
    )


def test_a_master_cut_off_from_etcd_stops_acknowledging_then_gives_its_key_up(
    group: GroupCluster,
) -> None:
    """etcd paused (SIGSTOP): the master cannot renew its lease, so it deposes itself within
    the TTL (2 s) without hearing from etcd: it must stop before a controller could appoint
    another master. etcd resumed, it revokes its lease so a controller appoints a replica,
    and follows that one."""
    wait_until(lambda: status(group.master)["isr"] == ["b1", "b2"], 15, "both replicas in sync")
    group.etcd.pause()
    paused = time.monotonic()
    try:
        wait_until(lambda: status(group.master)["deposed"], 5, "the master to depose itself")
        assert time.monotonic() - paused < 2.5  # TTL 2 s, polled every 50 ms
    finally:
        group.etcd.resume()
    new_master = wait_until(
        lambda: acting_master(group),
        15,
        "a replica appointed master",
    )
    assert status(new_master)["epoch"] >= 2
    # Back in etcd, the old master starts over as a replica of the new one (it never takes
    # office again on its own). It may cut records its broker wrote after the replicas' last
    # fetch (its own bookkeeping, acknowledged to nobody), never below where its own epoch
    # ended on the new master: the start of the first epoch after its own.
    wait_until(
        lambda: role(group.master) == "replica" and status(group.master)["connected"],
        15,
        "the old master following the new one",
    )
    old, new = status(group.master), status(new_master)
    # A pause longer than the leases' TTL can expire the appointed replica's own lease too,
    # just after etcd resumes: it is then appointed again, in a later epoch. Either way the
    # old master follows the new one's epoch.
    assert old["master"] == new["member"] and old["epoch"] == new["epoch"] >= 2, (old, new)
    start = next(offset for epoch, offset in new["epochs"] if epoch > 1)
    assert old["truncated_to"] is None or old["truncated_to"] == start, (old, new)


def test_a_master_restarted_with_an_empty_data_directory_does_not_take_office_again(
    group: GroupCluster,
) -> None:
    """Restarted within its lease's TTL with its data gone, the old master would find the key
    naming itself and take it over with an empty log; it must wait for the controller, which
    appoints an in-sync replica, and then follow that one."""
    wait_until(lambda: status(group.master)["isr"] == ["b1", "b2"], 15, "both replicas in sync")
    assert group.proxy is not None
    group.proxy.create_topic("orders", "normal", queues=1)
    client = producer(group, "orders")
    try:
        for i in range(5):
            client.send(message("orders", i))
    finally:
        client.shutdown()
    group.master.kill()
    shutil.rmtree(group.master.data_dir)
    group.master.start()  # the same member and port, at once: its old lease still lives
    assert status(group.master)["role"] == "replica"
    new_master = wait_until(
        lambda: acting_master(group),
        15,
        "a replica appointed master",
    )
    wait_until(
        lambda: status(group.master)["visible_offset"] >= status(new_master)["end_offset"] > 0,
        15,
        "the old master to copy the new one's log",
    )


def test_a_master_stalled_for_less_than_the_default_tolerates_is_not_replaced(
    group: GroupCluster,
) -> None:
    """SIGSTOP for half of what the defaults promise to tolerate, then SIGCONT: the master
    renews its lease when it resumes, so etcd never deletes its key and no controller elects
    another. Watched until a lease left unrenewed since the stall began would have expired
    (and etcd's expiry scan run), then a send goes through the same master."""
    wait_until(lambda: status(group.master)["isr"] == ["b1", "b2"], 15, "both replicas in sync")
    assert group.proxy is not None
    group.proxy.create_topic("orders", "normal", queues=1)
    stall_s = defaults.PAUSE_TOLERATED_S / 2
    stalled = time.monotonic()
    group.master.pause()
    try:
        time.sleep(max(0.0, stalled + stall_s - time.monotonic()))  # the stall itself
    finally:
        group.master.resume()
    assert time.monotonic() - stalled < defaults.PAUSE_TOLERATED_S, "stalled longer than meant"
    unrenewed_expiry = stalled + defaults.LEASE_TTL_S + ETCD_EXPIRY_SCAN_S + 0.5
    while time.monotonic() < unrenewed_expiry:
        master, replicas = status(group.master), [status(b) for b in group.replicas]
        assert master["role"] == "master" and master["epoch"] == 1, master
        assert not master["deposed"], master
        assert all(r["role"] == "replica" and r["epoch"] == 1 for r in replicas), replicas
        time.sleep(0.05)  # polling with a deadline: nothing may change until it passes
    client = producer(group, "orders")
    try:
        client.send(message("orders", 0))
    finally:
        client.shutdown()
    assert status(group.master)["epoch"] == 1
