"""A broker group's master cut off from etcd and from its replicas, while clients still reach
it: it must acknowledge nothing once its lease is gone.

The proxy is on the master's side of the partition (cut off from etcd and the
replicas too): its view of the cluster is the one it had, so it keeps routing
to the master, and only the master's own fencing can refuse. (A proxy that
still sees etcd drops the group's route once the master's lease is gone, which
would hide a master that does not fence itself.)

The test process sends without pause through the proxy (raw gRPC, each attempt
timed) and polls the group's master key in etcd every few milliseconds. The key
lives under the master's lease: once etcd shows it gone, the master is deposed
and another could be elected in a new epoch. A send *issued* after the key was
seen gone and acknowledged is the violation (two masters could acknowledge in
one epoch); the check cannot blame a master for an answer already on its way.
Meanwhile a controller on etcd's side appoints an in-sync replica in a new
epoch; after healing the proxy routes to it, so acknowledgements from then on
are the new master's and are not counted. The old master, healed, cuts what
it wrote past where the new master's log parts from its own and follows it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.cluster_server import wait_until
from tests.netns.group import LEASE_TTL_S, KeyWatch, NetGroup
from tests.netns.network import VirtualNetwork
from tests.netns.sends import Attempt, RawSender
from tests.replication.group_cluster import receive_all

AFTER_DEPOSED_S = 3.0  # how long sends go on after the key is gone, and after healing


@pytest.fixture
def group_factory(network: VirtualNetwork, tmp_path: Path) -> Iterator[object]:
    made: list[NetGroup] = []

    def make(mode: str) -> NetGroup:
        group = NetGroup(network, tmp_path / mode, mode=mode)
        made.append(group)
        group.start()
        wait_until(lambda: group.status(0)["isr"] == ["b1", "b2"], 20, "both replicas in sync")
        group.proxy.create_topic("orders", "normal", queues=2)
        return group

    yield make
    for group in made:
        group.kill()


class Load:
    """Sends one message after the other from a thread until stopped; every attempt kept."""

    def __init__(self, group: NetGroup) -> None:
        self.sender = RawSender(group.proxy.address)
        self.attempts: list[Attempt] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            self.attempts.append(self.sender.send("orders", f"m-{i}", timeout=3))
            i += 1
            if not self.attempts[-1].ok:
                time.sleep(0.01)  # a refusal comes at once: do not spin

    def stop(self) -> list[Attempt]:
        self.stopping.set()
        self.thread.join(10)
        self.sender.close()
        return list(self.attempts)


def watch_for(watch: KeyWatch, seconds: float, until: object = None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        watch.poll()
        if until is not None and until():  # type: ignore[operator]
            return
        time.sleep(0.005)


def run_partition(
    group: NetGroup, network: VirtualNetwork, cut_from: tuple[str, ...] = ("etcd1", "b1", "b2")
) -> dict[str, object]:
    watch = KeyWatch(group, group.keys.master)
    watch.poll()
    assert watch.value is not None and watch.value["member"] == "b0", watch.value
    old_epoch = int(watch.value["epoch"])
    load = Load(group)
    try:
        wait_until(lambda: sum(a.ok for a in load.attempts) >= 5, 10, "first acknowledgements")
        cut = time.time()
        # The master and the proxy on one side, etcd and the replicas on the other.
        network.isolate("b0", *cut_from)
        network.isolate("proxy", *cut_from)
        watch_for(watch, LEASE_TTL_S + 5, until=lambda: watch.first_absent is not None)
        assert watch.first_absent is not None, "the master's key outlived its lease"
        watch_for(watch, AFTER_DEPOSED_S)
        healed = time.time()
        network.heal()
        watch_for(watch, AFTER_DEPOSED_S)
    finally:
        attempts = load.stop()
    epoch = group.key(group.keys.epoch)
    return {
        "attempts": attempts, "cut": cut, "gone": watch.first_absent, "healed": healed,
        "old_epoch": old_epoch, "epoch": epoch,
    }  # fmt: skip


def check(result: dict[str, object]) -> None:
    attempts: list[Attempt] = result["attempts"]  # type: ignore[assignment]
    gone: float = result["gone"]  # type: ignore[assignment]
    cut: float = result["cut"]  # type: ignore[assignment]
    healed: float = result["healed"]  # type: ignore[assignment]
    acknowledged = [a for a in attempts if a.ok]
    # Until healed the proxy reaches only the old master, so an acknowledgement of a send
    # issued then is the old master's. After healing, the master a controller appointed
    # meanwhile (a new epoch) acknowledges sends through the same proxy, rightly.
    late = [a for a in acknowledged if gone < a.started < healed]
    after_cut = [a for a in acknowledged if a.started > cut]
    codes = sorted({a.code for a in attempts if not a.ok})
    print(
        f"{len(attempts)} sends, {len(acknowledged)} acknowledged "
        f"({len(after_cut)} issued after the cut, {len(late)} after the key was gone "
        f"{gone - cut:.2f} s after the cut); refusals {codes}; epoch {result['epoch']}"
    )
    assert not late, f"{len(late)} sends issued after the master's lease was gone were acknowledged"
    epoch = result["epoch"]
    # A controller on etcd's side appointed an in-sync replica in a new epoch.
    assert epoch is not None and epoch["epoch"] > result["old_epoch"] and epoch["master"] != "b0"


def test_a_sync_master_cut_off_acknowledges_nothing_once_its_lease_is_gone(
    group_factory: object, network: VirtualNetwork
) -> None:
    check(run_partition(group_factory("sync"), network))  # type: ignore[operator]


def test_an_async_master_cut_off_acknowledges_nothing_once_its_lease_is_gone(
    group_factory: object, network: VirtualNetwork
) -> None:
    check(run_partition(group_factory("async"), network))  # type: ignore[operator]


def test_a_sync_master_cut_off_from_etcd_alone_acknowledges_nothing_once_its_lease_is_gone(
    group_factory: object, network: VirtualNetwork
) -> None:
    check(run_partition(group_factory("sync"), network, cut_from=("etcd1",)))  # type: ignore[operator]


def test_a_replica_takes_over_and_the_old_masters_unacknowledged_tail_is_never_delivered(
    group_factory: object, network: VirtualNetwork
) -> None:
    """The master cut off writes sends it can no longer acknowledge (its tail); a replica is
    appointed in a new epoch and acknowledges sends of its own. Healed, the old master cuts
    its tail, follows the new master, and a consumer never sees the tail."""
    group: NetGroup = group_factory("sync")  # type: ignore[operator]
    old = group.key(group.keys.master)
    assert old is not None
    sender = RawSender(group.proxy.address)
    try:
        before = [sender.send("orders", f"before-{i}", timeout=5) for i in range(5)]
        assert all(a.ok for a in before), [a.code for a in before]
        network.isolate("b0", "etcd1", "b1", "b2")
        network.isolate("proxy", "etcd1", "b1", "b2")
        end_at_cut = group.status(0)["end_offset"]  # the test process still reaches b0
        # Written to the old master's log, then refused once it deposes itself.
        tail = [sender.send("orders", f"tail-{i}", timeout=LEASE_TTL_S + 5) for i in range(3)]
        assert not any(a.ok for a in tail), [a.code for a in tail]
        assert group.status(0)["end_offset"] > end_at_cut, "the old master wrote no tail"

        def new_master() -> bool:
            found = group.key(group.keys.master)
            return found is not None and found["member"] != "b0" and found["epoch"] > old["epoch"]

        wait_until(new_master, LEASE_TTL_S + 10, "a replica elected master in a new epoch")
        master = group.key(group.keys.master)
        assert master is not None
        index = int(master["member"][1:])
        network.heal()
        # The proxy reaches the new master now; what it acknowledges, the old one must copy.
        after: list[Attempt] = []
        wait_until(
            lambda: (
                after.append(sender.send("orders", f"after-{len(after)}", timeout=5))
                or sum(a.ok for a in after) >= 5
            ),
            30,
            "sends acknowledged by the new master",
        )
    finally:
        sender.close()
    wait_until(lambda: _role(group, 0) == "replica", 20, "the old master to follow")
    # Its follower cuts the tail before it streams.
    cut = wait_until(lambda: group.status(0)["truncated_to"], 20, "the old master's tail cut")
    assert cut <= end_at_cut
    wait_until(
        lambda: group.status(0)["visible_offset"] == group.status(index)["end_offset"],
        20,
        "the old master to copy the new master's log",
    )
    queues = [("orders", 0), ("orders", 1)]
    assert group.status(0, queues)["max_offsets"] == group.status(index, queues)["max_offsets"]
    delivered = receive_all(group.proxy.address, at_least=10, timeout=30)
    assert not [b for b in delivered if b.startswith("tail-")], delivered
    acknowledged = [a.body for a in before + after if a.ok]
    assert set(acknowledged) <= set(delivered), sorted(set(acknowledged) - set(delivered))


def _role(group: NetGroup, index: int) -> str | None:
    try:
        return str(group.status(index)["role"])
    except Exception:  # noqa: BLE001 - a member starting over does not answer for a moment
        return None
