"""The nemesis run: faults at random against a whole cluster under load, then a checker.

Three etcd members, one broker group (a master and two replicas, sync
replication) and two proxies, each a real process on its own network
namespace (``cluster.py``). Producers send plain, FIFO, transactional
messages and transaction groups; consumers drain every topic
(``workload.py``). Meanwhile the nemesis SIGKILLs and restarts, pauses and
resumes, and partitions brokers, proxies and one etcd member
(``nemesis.py``). Then every fault is healed, producers stop, consumers drain,
and :func:`halfmoon.verify.check` judges the history: nothing acknowledged
lost, nothing delivered that was never sent, per-message-group order,
transactions and transaction groups all or nothing.

``HALFMOON_NEMESIS_SECONDS`` bounds the faults (default 60);
``HALFMOON_NEMESIS_SEED`` replays a run's draws (the seed is printed). The
history is written to the test's directory as ``history.jsonl``. A longer run::

    HALFMOON_NEMESIS_SECONDS=600 .venv/bin/pytest -s tests/nemesis
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from halfmoon.verify import History, Outcome, check
from tests.nemesis.cluster import CONSUMER_GROUPS, NemesisCluster
from tests.nemesis.nemesis import FAULTS as ALL_FAULTS
from tests.nemesis.nemesis import Nemesis
from tests.nemesis.workload import (
    Consumer,
    FifoProducer,
    GroupProducer,
    PlainProducer,
    Producer,
    TransactionProducer,
    wait_for,
)
from tests.netns.network import VirtualNetwork

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("HALFMOON_NEMESIS_SECONDS", "60"))
FAULTS = tuple(  # a subset of kill,pause,partition; empty: a control run without faults
    f for f in os.environ.get("HALFMOON_NEMESIS_FAULTS", ",".join(ALL_FAULTS)).split(",") if f
)
RECOVER_S = 60.0  # after healing: the cluster acknowledges sends again within this
QUIET_S = 10.0  # drained: no delivery for this long once every expected message is in
DRAIN_S = 120.0


@pytest.fixture
def cluster(network: VirtualNetwork, tmp_path: Path) -> Iterator[NemesisCluster]:
    made = NemesisCluster(network, tmp_path)
    try:
        yield made.start()
    finally:
        made.kill()


def expected_keys(history: History) -> set[str]:
    """What the checker will demand: acknowledged sends outside units, and of committed units."""
    committed = {
        d.txn_group or d.txn for d in history.decisions if d.commit and d.outcome is Outcome.OK
    }
    return {
        s.key
        for s in list(history.sends)
        if s.outcome is Outcome.OK and (s.txn_group or s.txn) in (None, *committed)
    }


def test_nemesis_run_loses_nothing_acknowledged_and_keeps_order_and_atomicity(
    cluster: NemesisCluster, tmp_path: Path
) -> None:
    seed = int(os.environ.get("HALFMOON_NEMESIS_SEED") or random.SystemRandom().randrange(2**32))
    print(f"\nnemesis seed {seed} (HALFMOON_NEMESIS_SEED={seed} replays the draws)")
    print(f"{SECONDS} s of {', '.join(FAULTS) or 'no faults'}")
    draws = random.Random(seed)
    history = History()
    endpoints = cluster.endpoints
    producers: list[Producer] = [
        PlainProducer("plain", endpoints, history, draws.randrange(2**32)),
        FifoProducer("fifo-a", endpoints, history, draws.randrange(2**32)),
        FifoProducer("fifo-b", endpoints, history, draws.randrange(2**32)),
        TransactionProducer("txn", endpoints, history, draws.randrange(2**32)),
        GroupProducer("group", endpoints, history, draws.randrange(2**32)),
    ]
    consumers = [Consumer(topic, endpoints, history).start() for topic in ("plain", "fifo", "txn")]
    nemesis = Nemesis(cluster, draws.randrange(2**32), FAULTS)
    try:
        for producer in producers:
            producer.start()
        nemesis.start()
        nemesis.stopping.wait(SECONDS)  # the run's length: the faults go on meanwhile
        nemesis.stop()
        nemesis.heal_all()
        healed = time.time()
        # The cluster recovers: each producer has an acknowledgement after healing.
        recovered = wait_for(
            lambda: all(
                any(
                    s.producer == p.name and s.outcome is Outcome.OK and s.invoked > healed
                    for s in list(history.sends)
                )
                for p in producers
            ),
            RECOVER_S,
        )
        for producer in producers:
            producer.stop()
        expected = expected_keys(history)
        wait_for(
            lambda: (
                expected <= {d.key for d in list(history.deliveries)}
                and time.monotonic() - max(c.last_delivery for c in consumers) > QUIET_S
            ),
            DRAIN_S,
        )
        for consumer in consumers:
            consumer.stop()
        # The final read: new consumer groups read every topic from its beginning.
        for topic, fields in CONSUMER_GROUPS.items():
            cluster.proxies[0].create_group(f"final-{topic}", **fields)
        history.final_read = True
        consumers += [
            Consumer(topic, endpoints, history, group=f"final-{topic}", final=True).start()
            for topic in CONSUMER_GROUPS
        ]
        wait_for(
            lambda: (
                expected <= {d.key for d in list(history.deliveries) if d.final}
                and time.monotonic() - max(c.last_delivery for c in consumers) > QUIET_S
            ),
            DRAIN_S,
        )
    finally:
        for producer in producers:
            producer.stop()
        for consumer in consumers:
            consumer.stop()
        history.dump(tmp_path / "history.jsonl")
        print("\n".join(nemesis.log))
        print(cluster.group_state())
        for consumer in consumers:
            print(f"{consumer.name}: {consumer.errors} errors ({consumer.last_error})")
    result = check(history)
    print(result.summary())
    print(f"history: {tmp_path / 'history.jsonl'}")
    assert result.counts["acked"] > 0 and result.counts["delivered"] > 0, result.summary()
    assert result.valid, result.summary()
    assert recovered, f"not every producer had a send acknowledged within {RECOVER_S} s of healing"
