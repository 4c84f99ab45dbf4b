"""Transaction groups spanning brokers: the crash matrix, with real broker processes and etcd.

Each test puts members of one group on every broker, decides the group, and
SIGKILLs the coordinator or a participant at one step of the commit
(``HALFMOON_TEST_TXN_CRASH_AT`` names the step inside the process, or the test
kills a broker from outside). After the restart the group is all visible or
all invisible on every broker, never half, and every acknowledged member is
still there (pending, or visible once decided).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageType, OutgoingMessage
from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.coordination.etcd_json import parse_coordinator, range_prefix_sync
from halfmoon.cluster.coordination.etcd_tls import PLAIN
from halfmoon.cluster.coordination.metadata import ClusterMetadata
from halfmoon.cluster.internal.remote_broker import RemoteBroker
from halfmoon.cluster.internal.txn_groups import (
    CLEANUP_INTERVAL_S,
    GROUPS_DIR,
    coordinator_for,
)
from halfmoon.errors import HalfmoonError
from halfmoon.failpoints import TXN_GROUP_ENV
from tests.cluster.broker_processes import BrokerProcess
from tests.cluster.etcd_server import EtcdServer

TOPIC = "txn-orders"
MEMBERS_PER_BROKER = 3
RESOLVED_WITHIN_S = 15.0  # a live participant asks its coordinator every second, members 2 s old


class Cluster:
    """Real broker processes of one cluster, and a RemoteBroker to each."""

    def __init__(
        self,
        tmp_path: Path,
        etcd: EtcdServer,
        cluster: str,
        names: list[str],
        extra: tuple[str, ...] = (),
    ) -> None:
        args = ("--cluster", cluster, "--coordinator", etcd.url, "--lease-ttl", "2", *extra)
        self.processes = {
            name: BrokerProcess(tmp_path / name, name=name, extra=args) for name in names
        }
        self.remotes: dict[str, RemoteBroker] = {}

    def start(self, name: str, crash_at: str | None = None) -> None:
        process = self.processes[name]
        process.env = {TXN_GROUP_ENV: crash_at} if crash_at else {}
        process.start()
        old = self.remotes.pop(name, None)
        if old is not None:
            old.close()
        self.remotes[name] = RemoteBroker(process.address, timeout_s=10)

    def kill(self, name: str) -> None:
        self.processes[name].kill()

    def close(self) -> None:
        for remote in self.remotes.values():
            remote.close()
        for process in self.processes.values():
            process.kill()

    def send_members(self, group: str) -> None:
        for name, remote in self.remotes.items():
            with contextlib.suppress(HalfmoonError):
                remote.create_topic(TOPIC, MessageType.TRANSACTION, queue_count=1)
            members = [
                OutgoingMessage(
                    TOPIC,
                    f"{name}-{i}".encode(),
                    message_type=MessageType.TRANSACTION,
                    producer_group="pg",
                    transaction_group=group,
                )
                for i in range(MEMBERS_PER_BROKER)
            ]
            assert len(remote.send(members)) == MEMBERS_PER_BROKER  # acknowledged

    def visible(self, name: str) -> int:
        return sum(q.max_offset for q in self.remotes[name].topic_status(TOPIC))

    def pending(self, name: str, group: str) -> int:
        return sum(
            1 for t in self.remotes[name].list_transactions() if t.transaction_group == group
        )

    def state(self, group: str) -> dict[str, tuple[int, int]]:
        """Per broker: (members visible, members still pending)."""
        return {name: (self.visible(name), self.pending(name, group)) for name in self.remotes}


@pytest.fixture
def make_cluster(
    tmp_path: Path, etcd: EtcdServer, cluster_name: str
) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(*names: str, extra: tuple[str, ...] = ()) -> Cluster:
        cluster = Cluster(tmp_path, etcd, cluster_name, list(names), extra)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


def group_coordinated_by(coordinator: str, brokers: list[str]) -> str:
    for n in range(1000):
        group = f"batch-{n}"
        if coordinator_for(group, brokers) == coordinator:
            return group
    raise AssertionError("no group id hashes to " + coordinator)


def all_visible(cluster: Cluster, group: str) -> dict[str, tuple[int, int]]:
    return {name: (MEMBERS_PER_BROKER, 0) for name in cluster.remotes}


def none_visible(cluster: Cluster, group: str) -> dict[str, tuple[int, int]]:
    return {name: (0, MEMBERS_PER_BROKER) for name in cluster.remotes}


def wait_for_state(cluster: Cluster, group: str, expected: dict[str, tuple[int, int]]) -> None:
    deadline = time.monotonic() + RESOLVED_WITHIN_S
    state = cluster.state(group)
    while state != expected and time.monotonic() < deadline:
        time.sleep(0.1)
        state = cluster.state(group)
    assert state == expected


def never_half(cluster: Cluster, group: str, hold_s: float = 2.5) -> None:
    """Over ``hold_s`` (past a participant's first recovery round) no member becomes visible."""
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        assert cluster.state(group) == none_visible(cluster, group)
        time.sleep(0.2)


def decide_expecting_crash(cluster: Cluster, via: str, group: str, resolution: str) -> None:
    with pytest.raises(HalfmoonError):
        cluster.remotes[via].end_transaction_group(group, resolution)


BROKERS = ["broker-a", "broker-b"]


def test_group_decided_through_a_participant_commits_on_every_broker(make_cluster) -> None:
    cluster = make_cluster(*BROKERS)
    for name in BROKERS:
        cluster.start(name)
    group = group_coordinated_by("broker-a", BROKERS)
    cluster.send_members(group)
    # Sent to broker-b, which is not the coordinator: forwarded to broker-a.
    assert cluster.remotes["broker-b"].end_transaction_group(group, "commit") == 2 * 3
    assert cluster.state(group) == all_visible(cluster, group)
    # Repeated: a no-op; the opposite decision is refused on every broker.
    assert cluster.remotes["broker-a"].end_transaction_group(group, "commit") == 0
    with pytest.raises(HalfmoonError) as refused:
        cluster.remotes["broker-b"].end_transaction_group(group, "rollback")
    assert refused.value.code == "TRANSACTION_ALREADY_ENDED"


def test_coordinator_killed_before_the_decision_is_durable(make_cluster) -> None:
    cluster = make_cluster(*BROKERS)
    cluster.start("broker-a", crash_at="coordinator-before-decision")
    cluster.start("broker-b")
    group = group_coordinated_by("broker-a", BROKERS)
    cluster.send_members(group)
    decide_expecting_crash(cluster, "broker-b", group, "commit")
    cluster.processes["broker-a"].wait_stopped()
    cluster.start("broker-a")
    never_half(cluster, group)  # no decision was made: every member stays pending
    # The caller, who got an error, decides again: all members, none lost. broker-b's own
    # recovery round may ask the coordinator between its decision and its call to broker-b,
    # and complete its members itself; they then count there, not in this answer.
    decided = cluster.remotes["broker-b"].end_transaction_group(group, "commit")
    assert MEMBERS_PER_BROKER <= decided <= 2 * MEMBERS_PER_BROKER
    wait_for_state(cluster, group, all_visible(cluster, group))


def test_coordinator_killed_after_the_decision_participant_resolves(make_cluster) -> None:
    cluster = make_cluster(*BROKERS)
    cluster.start("broker-a", crash_at="coordinator-after-decision")
    cluster.start("broker-b")
    group = group_coordinated_by("broker-a", BROKERS)
    cluster.send_members(group)
    decide_expecting_crash(cluster, "broker-a", group, "commit")
    cluster.processes["broker-a"].wait_stopped()
    # broker-b holds its members pending while the coordinator is down: nothing of b is visible.
    assert cluster.pending("broker-b", group) == MEMBERS_PER_BROKER
    assert cluster.visible("broker-b") == 0
    cluster.start("broker-a")  # local recovery completes a's members; b asks a for the decision
    wait_for_state(cluster, group, all_visible(cluster, group))


def test_coordinator_killed_after_a_rollback_decision(make_cluster) -> None:
    cluster = make_cluster(*BROKERS)
    cluster.start("broker-a", crash_at="coordinator-after-decision")
    cluster.start("broker-b")
    group = group_coordinated_by("broker-a", BROKERS)
    cluster.send_members(group)
    decide_expecting_crash(cluster, "broker-b", group, "rollback")
    cluster.processes["broker-a"].wait_stopped()
    cluster.start("broker-a")
    wait_for_state(cluster, group, {name: (0, 0) for name in BROKERS})


def test_coordinator_killed_between_participants(make_cluster) -> None:
    names = ["broker-a", "broker-b", "broker-c"]
    cluster = make_cluster(*names)
    group = group_coordinated_by("broker-a", names)
    cluster.start("broker-a", crash_at="coordinator-between-participants")
    cluster.start("broker-b")
    cluster.start("broker-c")
    cluster.send_members(group)
    decide_expecting_crash(cluster, "broker-c", group, "commit")
    cluster.processes["broker-a"].wait_stopped()
    # broker-b (first in name order) applied the decision before the crash; broker-c did not.
    assert cluster.visible("broker-b") == MEMBERS_PER_BROKER
    assert cluster.pending("broker-c", group) == MEMBERS_PER_BROKER
    cluster.start("broker-a")
    wait_for_state(cluster, group, all_visible(cluster, group))


def test_participant_killed_before_the_decision_resolves_at_restart(make_cluster) -> None:
    cluster = make_cluster(*BROKERS)
    for name in BROKERS:
        cluster.start(name)
    group = group_coordinated_by("broker-a", BROKERS)
    cluster.send_members(group)
    cluster.kill("broker-b")
    # The coordinator decides without the dead participant: its own members only.
    assert cluster.remotes["broker-a"].end_transaction_group(group, "commit") == MEMBERS_PER_BROKER
    cluster.start("broker-b")  # asks broker-a at once and completes its members
    wait_for_state(cluster, group, all_visible(cluster, group))


def test_participant_killed_during_its_recovery(make_cluster) -> None:
    cluster = make_cluster(*BROKERS)
    for name in BROKERS:
        cluster.start(name)
    group = group_coordinated_by("broker-a", BROKERS)
    cluster.send_members(group)
    cluster.kill("broker-b")
    cluster.remotes["broker-a"].end_transaction_group(group, "commit")
    # Restarted, broker-b gets the decision from broker-a and is killed before applying it.
    process = cluster.processes["broker-b"]
    process.env = {TXN_GROUP_ENV: "participant-before-apply"}
    process.start()
    process.wait_stopped()
    assert process.process is not None and process.process.returncode == -9
    cluster.start("broker-b")
    wait_for_state(cluster, group, all_visible(cluster, group))


def test_coordinator_killed_with_a_participant_down(make_cluster) -> None:
    """Both crash: the participant before the decision, the coordinator right after it."""
    cluster = make_cluster(*BROKERS)
    cluster.start("broker-a", crash_at="coordinator-after-decision")
    cluster.start("broker-b")
    group = group_coordinated_by("broker-a", BROKERS)
    cluster.send_members(group)
    cluster.kill("broker-b")
    decide_expecting_crash(cluster, "broker-a", group, "commit")
    cluster.processes["broker-a"].wait_stopped()
    cluster.start("broker-b")  # the coordinator is still down: b's members stay pending
    assert cluster.visible("broker-b") == 0
    assert cluster.pending("broker-b", group) == MEMBERS_PER_BROKER
    cluster.start("broker-a")
    wait_for_state(cluster, group, all_visible(cluster, group))


def test_consume_actions_live_on_the_coordinator_and_commit_with_the_group(make_cluster) -> None:
    """Transactional consumption: an ack on the coordinator commits with the group's members
    on every broker; an ack on a participant is refused (it could not stay atomic there)."""
    cluster = make_cluster(*BROKERS)
    for name in BROKERS:
        cluster.start(name)
    group = group_coordinated_by("broker-a", BROKERS)
    received = {}
    for name, remote in cluster.remotes.items():
        remote.create_topic("inputs", MessageType.NORMAL, queue_count=1)
        remote.create_group("workers", consume_from="earliest")
        remote.send([OutgoingMessage("inputs", f"in-{name}".encode())])
        (received[name],) = remote.receive("workers", "inputs", FilterSpec(), 1, 60_000)
    a, b = cluster.remotes["broker-a"], cluster.remotes["broker-b"]
    with pytest.raises(HalfmoonError) as refused:
        b.transactional_ack(group, "workers", "inputs", received["broker-b"].receipt_handle)
    assert refused.value.code == "TRANSACTION_NOT_ON_COORDINATOR"
    a.transactional_ack(group, "workers", "inputs", received["broker-a"].receipt_handle)
    cluster.send_members(group)
    assert b.end_transaction_group(group, "commit", consume_actions=1) == 2 * MEMBERS_PER_BROKER
    assert cluster.state(group) == all_visible(cluster, group)
    # The ack was applied with the commit: a's input is consumed; b's is still in flight.
    assert [p.inflight for p in a.group_progress("workers", "inputs")] == [0]
    assert [p.inflight for p in b.group_progress("workers", "inputs")] == [1]


def test_participant_killed_after_applying_before_answering(make_cluster) -> None:
    cluster = make_cluster(*BROKERS)
    cluster.start("broker-a")
    cluster.start("broker-b", crash_at="participant-after-apply")
    group = group_coordinated_by("broker-a", BROKERS)
    cluster.send_members(group)
    # The coordinator counts what it heard of: its own members; b's answer died with b.
    assert cluster.remotes["broker-a"].end_transaction_group(group, "commit") == MEMBERS_PER_BROKER
    cluster.processes["broker-b"].wait_stopped()
    cluster.start("broker-b")
    wait_for_state(cluster, group, all_visible(cluster, group))
    # Deciding again is a no-op everywhere: nothing doubled.
    assert cluster.remotes["broker-b"].end_transaction_group(group, "commit") == 0
    assert cluster.state(group) == all_visible(cluster, group)


def test_a_commit_the_coordinator_turns_into_a_rollback_drops_every_member(make_cluster) -> None:
    """The client says it registered 2 consume actions, the coordinator holds 1: the group is
    rolled back there (TRANSACTION_INCOMPLETE) and on the participant in the same call."""
    cluster = make_cluster(*BROKERS)
    for name in BROKERS:
        cluster.start(name)
    group = group_coordinated_by("broker-a", BROKERS)
    a = cluster.remotes["broker-a"]
    a.create_topic("inputs", MessageType.NORMAL, queue_count=1)
    a.create_group("workers", consume_from="earliest")
    a.send([OutgoingMessage("inputs", b"in")])
    (received,) = a.receive("workers", "inputs", FilterSpec(), 1, 60_000)
    a.transactional_ack(group, "workers", "inputs", received.receipt_handle)
    cluster.send_members(group)
    with pytest.raises(HalfmoonError) as failed:
        cluster.remotes["broker-b"].end_transaction_group(group, "commit", consume_actions=2)
    assert failed.value.code == "TRANSACTION_INCOMPLETE"
    assert cluster.state(group) == {name: (0, 0) for name in BROKERS}


# -- the records in etcd -----------------------------------------------------------------------


def group_records(etcd: EtcdServer, cluster_name: str) -> set[str]:
    """The transaction groups etcd holds a coordinator record for."""
    found, _ = range_prefix_sync(
        parse_coordinator(etcd.url), f"/halfmoon/{cluster_name}/{GROUPS_DIR}", tls=PLAIN
    )
    return {unquote(kv.key.rsplit("/", 1)[-1]) for kv in found}


def place_topic(etcd: EtcdServer, cluster_name: str) -> None:
    """TOPIC placed in etcd over both brokers, as a topic created through a proxy is."""

    async def place() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            await ClusterMetadata(client, cluster_name).create_topic(
                TOPIC, queues=2, message_type=MessageType.TRANSACTION.value
            )

    asyncio.run(place())


def wait_for_records(etcd: EtcdServer, cluster_name: str, expected: set[str]) -> None:
    deadline = time.monotonic() + FORGOTTEN_WITHIN_S
    while group_records(etcd, cluster_name) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group_records(etcd, cluster_name) == expected


FORGOTTEN_WITHIN_S = CLEANUP_INTERVAL_S * 3 + 5
# Records are forgotten as soon as the group is finished (the default keeps them 10 minutes).
NO_RETENTION = ("--set", "transaction.group_record_retention_ms=0")


def test_a_group_finished_everywhere_is_forgotten_in_etcd(
    make_cluster, etcd: EtcdServer, cluster_name: str
) -> None:
    cluster = make_cluster(*BROKERS, extra=NO_RETENTION)
    for name in BROKERS:
        cluster.start(name)
    place_topic(etcd, cluster_name)
    group = group_coordinated_by("broker-a", BROKERS)
    cluster.send_members(group)
    assert cluster.remotes["broker-b"].end_transaction_group(group, "commit") == 2 * 3
    assert group in group_records(etcd, cluster_name)
    wait_for_records(etcd, cluster_name, set())
    # Forgotten in etcd, still decided on every broker: the opposite decision is refused.
    with pytest.raises(HalfmoonError) as refused:
        cluster.remotes["broker-b"].end_transaction_group(group, "rollback")
    assert refused.value.code == "TRANSACTION_ALREADY_ENDED"
    assert cluster.state(group) == all_visible(cluster, group)


def test_a_group_with_a_participant_down_keeps_its_record_until_the_participant_applied_it(
    make_cluster, etcd: EtcdServer, cluster_name: str
) -> None:
    cluster = make_cluster(*BROKERS, extra=NO_RETENTION)
    for name in BROKERS:
        cluster.start(name)
    place_topic(etcd, cluster_name)
    group = group_coordinated_by("broker-a", BROKERS)
    cluster.send_members(group)
    cluster.kill("broker-b")
    cluster.processes["broker-b"].wait_stopped()
    assert cluster.remotes["broker-a"].end_transaction_group(group, "commit") == MEMBERS_PER_BROKER
    # broker-b holds pending members and needs the record to find the decision: it stays,
    # through several of the coordinator's cleanups and past broker-b's lease.
    deadline = time.monotonic() + CLEANUP_INTERVAL_S * 2 + 3
    while time.monotonic() < deadline:
        assert group in group_records(etcd, cluster_name)
        time.sleep(0.5)
    cluster.start("broker-b")
    wait_for_state(cluster, group, all_visible(cluster, group))
    wait_for_records(etcd, cluster_name, set())


def test_a_group_spanning_brokers_times_out_by_its_coordinators_decision(make_cluster) -> None:
    """Nobody decides a group with members on both brokers: past the transaction timeout
    the participant asks the coordinator, which records the rollback first and tells the
    others; every member on every broker is gone and a late commit is refused. The
    coordinator is SIGKILLed and restarted meanwhile: the deadline is in its log."""
    cluster = make_cluster(*BROKERS, extra=("--set", "transaction.group_timeout_ms=4s"))
    for name in BROKERS:
        cluster.start(name)
    group = group_coordinated_by("broker-a", BROKERS)
    cluster.send_members(group)
    assert cluster.state(group) == none_visible(cluster, group)
    cluster.kill("broker-a")
    cluster.start("broker-a")
    nothing = {name: (0, 0) for name in BROKERS}
    wait_for_state(cluster, group, nothing)  # within 4 s + a resolve round (15 s allowed)
    with pytest.raises(HalfmoonError) as late:
        cluster.remotes["broker-b"].end_transaction_group(group, "commit")
    assert late.value.code == "TRANSACTION_ROLLED_BACK"
    timed_out = [
        line
        for name in BROKERS
        for line in cluster.processes[name].output
        if "event=transaction_group_timed_out" in line
    ]
    assert timed_out, "no broker logged the timeout"
    assert cluster.state(group) == nothing
