"""The master's replication rules on a fake clock: the in-sync set, sync acknowledgement
(group commit), refusals, the ISR published before it is used, and a switchover's fence."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from halfmoon.cluster.errors import MasterDeposed, MasterSwitching, NotEnoughReplicas
from halfmoon.replication.epochs import EpochTable
from halfmoon.replication.leader import ReplicationLeader, ReplicationSettings
from halfmoon.replication.protocol import ReplicationRefused, StaleEpoch
from halfmoon.replication.replicated_store import ReplicatedStore
from halfmoon.store.store import MessageStore
from tests.store.storeutil import message, open_store


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


class Published:
    """The etcd side: records what was published; can refuse (a lost compare-and-swap)."""

    def __init__(self) -> None:
        self.sets: list[list[str]] = []
        self.accept = True

    def __call__(self, isr: list[str]) -> bool:
        if self.accept:
            self.sets.append(isr)
        return self.accept


@pytest.fixture
def store(tmp_path: Path) -> MessageStore:
    s = open_store(tmp_path / "m")
    yield s  # type: ignore[misc]
    s.close()


def leader(
    store: MessageStore, tmp_path: Path, clock: Clock, published: Published, **settings: object
) -> ReplicationLeader:
    config = ReplicationSettings(**{"mode": "sync", "min_insync": 2, **settings})  # type: ignore[arg-type]
    return ReplicationLeader(
        store, "g1", "m", 1, EpochTable(tmp_path), config, published, clock_ms=clock
    )


def write(store: MessageStore, n: int = 1) -> int:
    return store.append([message(i) for i in range(n)])[-1].end_offset


def done_now() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future


def test_a_sync_write_waits_for_every_in_sync_replica(store: MessageStore, tmp_path: Path) -> None:
    clock, published = Clock(), Published()
    lead = leader(store, tmp_path, clock, published)
    a, b = lead.connect("a", 0), lead.connect("b", 0)
    lead.acknowledge(a, 0)
    lead.acknowledge(b, 0)
    assert lead.check_isr() and lead.isr == ["a", "b"] and published.sets == [["a", "b"]]
    ends = [write(store) for _ in range(3)]
    acks = [lead.replicated(end, done_now()) for end in ends]
    lead.acknowledge(a, ends[-1])
    assert not any(f.done() for f in acks)  # b has none of them
    lead.acknowledge(b, ends[1])
    assert [f.done() for f in acks] == [True, True, False]  # one ack releases two writes
    lead.acknowledge(b, ends[2])
    assert acks[2].done() and acks[2].exception() is None
    assert lead.acknowledged_end == ends[2]


def test_with_too_few_in_sync_replicas_writes_are_refused(
    store: MessageStore, tmp_path: Path
) -> None:
    clock, published = Clock(), Published()
    lead = leader(store, tmp_path, clock, published, max_lag_ms=1000)
    a, b = lead.connect("a", 0), lead.connect("b", 0)
    lead.acknowledge(a, 0)
    lead.acknowledge(b, 0)
    lead.check_isr()
    end = write(store)
    waiting = lead.replicated(end, done_now())
    clock.ms += 500
    lead.acknowledge(a, end)  # b says nothing any more
    clock.ms += 600  # b last caught up 1.1 s ago
    assert lead.check_isr() and lead.isr == ["a"] and published.sets[-1] == ["a"]
    # The write that was waiting for b fails, and so does the next one, at once.
    assert isinstance(waiting.exception(), NotEnoughReplicas)
    refused = lead.replicated(write(store), done_now())
    assert isinstance(refused.exception(), NotEnoughReplicas)
    assert refused.exception().code == "NOT_ENOUGH_REPLICAS"  # type: ignore[union-attr]
    with pytest.raises(NotEnoughReplicas):  # a send is refused before it is written
        lead.admit()


def test_the_isr_changes_only_once_published(store: MessageStore, tmp_path: Path) -> None:
    clock, published = Clock(), Published()
    lead = leader(store, tmp_path, clock, published, min_insync=1)
    a = lead.connect("a", 0)
    lead.acknowledge(a, 0)
    published.accept = False  # etcd refuses (this member is no longer master, or etcd is away)
    assert not lead.check_isr() and lead.isr == []
    published.accept = True
    assert lead.check_isr() and lead.isr == ["a"]


def test_a_refused_set_is_reported_once_not_at_every_check(
    store: MessageStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The set is checked ten times a second: a master etcd no longer names says so once."""
    clock, published = Clock(), Published()
    lead = leader(store, tmp_path, clock, published, min_insync=1)
    a = lead.connect("a", 0)
    lead.acknowledge(a, 0)
    published.accept = False
    with caplog.at_level(logging.WARNING, logger="halfmoon.replication"):
        for _ in range(3):
            assert not lead.check_isr()
    refused = [m for m in caplog.messages if "event=isr_publish_refused" in m]
    assert refused == ["event=isr_publish_refused group=g1 epoch=1 isr= wanted=a"]


def test_a_replica_rejoins_only_holding_every_acknowledged_write(
    store: MessageStore, tmp_path: Path
) -> None:
    clock, published = Clock(), Published()
    lead = leader(store, tmp_path, clock, published, min_insync=1, max_lag_ms=1000)
    a, b = lead.connect("a", 0), lead.connect("b", 0)
    lead.acknowledge(a, 0)
    lead.acknowledge(b, 0)
    lead.check_isr()
    clock.ms += 2000
    lead.acknowledge(a, 0)
    lead.check_isr()
    assert lead.isr == ["a"]
    end = write(store, 5)
    ack = lead.replicated(end, done_now())
    lead.acknowledge(a, end)
    assert ack.done() and lead.acknowledged_end == end
    lead.acknowledge(b, end - 1)  # alive again, but short of an acknowledged write
    lead.acknowledge(b, end - 1)
    lead.check_isr()
    assert lead.isr == ["a"]
    lead.acknowledge(b, end)
    lead.check_isr()
    assert lead.isr == ["a", "b"]


def test_a_replica_too_many_bytes_behind_leaves_and_rejoins_once_within_them(
    store: MessageStore, tmp_path: Path
) -> None:
    """Lag in bytes alone: the replica answers in time (its time lag is nil) but holds less
    than the master's end minus ``max_lag_bytes``; it leaves, and rejoins once within."""
    clock, published = Clock(), Published()
    lead = leader(store, tmp_path, clock, published, min_insync=1, max_lag_bytes=500)
    a, b = lead.connect("a", 0), lead.connect("b", 0)
    lead.acknowledge(a, 0)
    lead.acknowledge(b, 0)
    assert lead.check_isr() and lead.isr == ["a", "b"]
    end = write(store, 20)
    assert store.visible_offset == end > 500
    lead.acknowledge(a, end)
    lead.acknowledge(b, end - 501)  # at once (no time lag), but 501 bytes short
    assert lead.check_isr() and lead.isr == ["a"] and published.sets[-1] == ["a"]
    lead.acknowledge(b, end - 500)  # within the bound again (and past every acknowledged write)
    assert lead.check_isr() and lead.isr == ["a", "b"] and published.sets[-1] == ["a", "b"]
    lead.acknowledge(b, end)
    assert not lead.check_isr()  # nothing changes while it stays within


def test_async_mode_acknowledges_on_the_local_flush(store: MessageStore, tmp_path: Path) -> None:
    lead = leader(store, tmp_path, Clock(), Published(), mode="async")
    local = done_now()
    assert lead.replicated(write(store), local) is local  # no replica involved
    lead.admit()  # and never refuses for want of replicas
    lead.depose()  # but a deposed master acknowledges nothing, whatever the mode
    assert isinstance(lead.replicated(write(store), done_now()).exception(), MasterDeposed)
    with pytest.raises(MasterDeposed):
        lead.admit()


def test_a_deposed_master_acknowledges_nothing(store: MessageStore, tmp_path: Path) -> None:
    clock, published = Clock(), Published()
    lead = leader(store, tmp_path, clock, published, min_insync=1)
    a = lead.connect("a", 0)
    lead.acknowledge(a, 0)
    lead.check_isr()
    waiting = lead.replicated(write(store), done_now())
    lead.depose()
    assert isinstance(waiting.exception(), MasterDeposed)
    assert isinstance(lead.replicated(write(store), done_now()).exception(), MasterDeposed)


def test_epoch_end_answers_where_an_epochs_part_of_the_log_ends(
    store: MessageStore, tmp_path: Path
) -> None:
    epochs = EpochTable(tmp_path)
    epochs.record(1, 0)
    parted = write(store, 3)
    epochs.record(3, parted)
    end = write(store, 2)
    master = ReplicationLeader(
        store, "g1", "m", 3, epochs, ReplicationSettings(), Published(), clock_ms=Clock()
    )
    assert master.epoch_end({"group": "g1", "epoch": 1}) == {
        "epoch": 3, "answered": 1, "end": parted,
    }  # fmt: skip
    # Epoch 2 never reached this master: the newest older one's end is the answer.
    assert master.epoch_end({"group": "g1", "epoch": 2})["end"] == parted
    assert master.epoch_end({"group": "g1", "epoch": 3})["end"] == end
    with pytest.raises(StaleEpoch):
        master.epoch_end({"group": "g1", "epoch": 4})
    with pytest.raises(ReplicationRefused):
        master.epoch_end({"group": "g2", "epoch": 1})


def test_a_fenced_store_refuses_writes_and_waits_for_the_ones_in_flight(
    store: MessageStore, tmp_path: Path
) -> None:
    m = leader(store, tmp_path, Clock(), Published(), min_insync=1)
    gated = ReplicatedStore(store, m)
    gated.append([message(0)])
    entered, release = threading.Event(), threading.Event()
    original = store.append

    def slow_append(messages):  # an append caught in flight when the fence goes up
        entered.set()
        release.wait(10)
        return original(messages)

    store.append = slow_append  # type: ignore[method-assign]
    writer = threading.Thread(target=gated.append, args=([message(1)],))
    writer.start()
    assert entered.wait(10)
    fenced = threading.Thread(target=gated.fence)
    fenced.start()
    fenced.join(0.2)
    assert fenced.is_alive()  # the fence waits for the append in flight
    release.set()
    fenced.join(10)
    writer.join(10)
    assert not fenced.is_alive()
    store.append = original  # type: ignore[method-assign]
    end = store.end_offset
    with pytest.raises(MasterSwitching):
        gated.append([message(2)])
    with pytest.raises(MasterSwitching):
        gated.put([message(3)])
    with pytest.raises(MasterSwitching):
        gated.append_fanout(message(3), [("other", 0)])
    assert store.end_offset == end  # nothing written while fenced
    gated.unfence()
    gated.append([message(4)])
    assert store.end_offset > end
    fanned = gated.append_fanout(message(5), [("other", 0)])
    assert [r.topic for r in fanned] == ["orders", "other"]


def test_wait_replica_returns_the_end_once_the_replica_holds_it(
    store: MessageStore, tmp_path: Path
) -> None:
    m = leader(store, tmp_path, Clock(), Published(), min_insync=1)
    end = write(store, 3)
    progress = m.connect("r1", 0)
    assert m.wait_replica("r1", 0.05) is None  # behind: times out
    assert m.wait_replica("nobody", 0.01) is None
    m.acknowledge(progress, end)
    assert m.wait_replica("r1", 1.0) == end
    lag = m.status()["replicas"]["r1"]
    assert (lag["lag_bytes"], lag["lag_ms"]) == (0, 0)


def test_a_new_masters_first_set_takes_only_replicas_holding_its_whole_log(
    store: MessageStore, tmp_path: Path
) -> None:
    # Found by the nemesis run: a master taking office over a log written in earlier epochs
    # (any of it may have been acknowledged then) let a replica far behind join its first
    # in-sync set; the controller later appointed that replica, and acknowledged writes were
    # gone.
    end = write(store, 5)  # the log as this master finds it when it takes office
    clock, published = Clock(), Published()
    lead = leader(store, tmp_path, clock, published, min_insync=1)
    assert lead.acknowledged_end == end
    behind = lead.connect("behind", 0)
    lead.acknowledge(behind, 0)  # alive and answering, but holding none of the log
    assert not lead.check_isr() and lead.isr == [] and published.sets == []
    with pytest.raises(NotEnoughReplicas):
        lead.admit()
    lead.acknowledge(behind, end)  # caught up with everything the log held
    assert lead.check_isr() and lead.isr == ["behind"]
