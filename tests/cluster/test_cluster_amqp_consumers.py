"""A queue's consumers counted across the proxies of a real cluster (etcd, two brokers, two
proxies), with pika: Declare-Ok's consumer count, ``queue.delete`` with ``if-unused`` and
exclusive consumers see every proxy's consumers (two proxies racing for one exclusive
consumer: one wins), an ``auto-delete`` queue goes with its last consumer on any proxy,
SIGKILLed ones included, an ``x-expires`` queue goes once unused on every proxy, deleted
by one of them, what a deleting proxy killed partway leaves in etcd is cleared by
another, and two worker processes of one proxy count and hold queues for each other (each
connection's worker found from the sockets it holds)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from halfmoon import failpoints
from halfmoon.cluster.coordination.amqp_consumers import LEFTOVER_AFTER_S, consumers_prefix
from halfmoon.cluster.coordination.etcd import EtcdClient
from tests.cluster.cluster_server import ClusterProxy, ClusterServer
from tests.cluster.test_cluster_amqp import connect
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServer]:
    """One cluster for the module's tests, each on queues of its own (proxies' leases: 2 s)."""
    server = ClusterServer(tmp_path_factory.mktemp("consumers") / "cluster").start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def doomed(tmp_path: Path) -> Iterator[ClusterServer]:
    """A cluster of this test's own: the test SIGKILLs a proxy."""
    server = ClusterServer(tmp_path / "cluster").start()
    try:
        yield server
    finally:
        server.kill()


def refused(call: object, *args: object, **kwargs: object) -> int:
    """The reply code of the channel error ``call`` ends in."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as error:
        call(*args, **kwargs)  # type: ignore[operator]
    return error.value.reply_code


def consumers(proxy: ClusterProxy, queue: str) -> int | None:
    """The consumer count a passive declare through ``proxy`` reports (None: no queue)."""
    connection = connect(proxy)
    try:
        return connection.channel().queue_declare(queue, passive=True).method.consumer_count
    except pika.exceptions.ChannelClosedByBroker as error:
        assert error.reply_code == 404, error
        return None
    finally:
        connection.close()


def exists(proxy: ClusterProxy, queue: str) -> bool:
    return consumers(proxy, queue) is not None


def ignore(*_: object) -> None:
    pass


def consumer_keys(cluster: ClusterServer, queue: str) -> list[str]:
    """The keys of ``queue``'s consumer directory in etcd (its name unescaped: plain letters)."""

    async def read() -> list[str]:
        async with EtcdClient.from_url(cluster.own_etcd.url) as client:
            listed, _ = await client.get_prefix(consumers_prefix(cluster.cluster))
        return [kv.key for kv in listed if f"/{queue}/" in kv.key]

    return asyncio.run(read())


def test_consumer_count_and_if_unused_see_every_proxys_consumers(cluster: ClusterServer) -> None:
    a, b = connect(cluster.proxies[0]), connect(cluster.proxies[1])
    try:
        on_a, on_b = a.channel(), b.channel()
        on_a.queue_declare("counted")
        tag = on_b.basic_consume("counted", ignore)
        assert on_a.queue_declare("counted", passive=True).method.consumer_count == 1
        on_a.basic_consume("counted", ignore)
        assert on_a.queue_declare("counted").method.consumer_count == 2
        assert on_b.queue_declare("counted", passive=True).method.consumer_count == 2

        # In use through the other proxy: refused; once it cancels, deleted.
        on_a.basic_cancel(on_a.consumer_tags[0])
        assert refused(a.channel().queue_delete, "counted", if_unused=True) == 406
        on_b.basic_cancel(tag)
        assert on_a.queue_declare("counted", passive=True).method.consumer_count == 0
        a.channel().queue_delete("counted", if_unused=True)
        assert not exists(cluster.proxies[1], "counted")
    finally:
        a.close()
        b.close()


def test_an_exclusive_consumer_holds_the_queue_on_every_proxy(cluster: ClusterServer) -> None:
    a, b = connect(cluster.proxies[0]), connect(cluster.proxies[1])
    try:
        on_a = a.channel()
        on_a.queue_declare("held")
        tag = on_a.basic_consume("held", ignore, exclusive=True)
        assert refused(b.channel().basic_consume, "held", ignore) == 403
        assert refused(b.channel().basic_consume, "held", ignore, exclusive=True) == 403
        on_a.basic_cancel(tag)

        shared = b.channel()
        shared.basic_consume("held", ignore)  # a shared consumer on B now
        assert refused(a.channel().basic_consume, "held", ignore, exclusive=True) == 403
        a.channel().basic_consume("held", ignore)  # another shared one is welcome
    finally:
        a.close()
        b.close()


def race_for(
    connection: pika.BlockingConnection,
    queue: str,
    start: threading.Barrier,
    outcomes: list[object],
) -> None:
    """Ask for an exclusive consumer of ``queue`` once every racer is ready."""
    racing = connection.channel()
    start.wait()
    try:
        racing.basic_consume(queue, ignore, exclusive=True)
        outcomes.append("won")
    except pika.exceptions.ChannelClosedByBroker as error:
        outcomes.append(error.reply_code)


def test_two_proxies_racing_for_an_exclusive_consumer_one_wins(cluster: ClusterServer) -> None:
    rounds = 5
    setup = connect(cluster.proxies[0])
    channel = setup.channel()
    for n in range(rounds):
        channel.queue_declare(f"raced-{n}")
    setup.close()
    connections = [connect(proxy) for proxy in cluster.proxies]
    try:
        for n in range(rounds):
            start = threading.Barrier(len(connections))
            outcomes: list[object] = []
            threads = [
                threading.Thread(target=race_for, args=(c, f"raced-{n}", start, outcomes))
                for c in connections
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(DEADLINE_S)
            assert sorted(outcomes, key=str) == [403, "won"], outcomes
            assert consumers(cluster.proxies[n % 2], f"raced-{n}") == 1
    finally:
        for connection in connections:
            connection.close()


def test_an_auto_delete_queue_goes_with_its_last_consumer_on_any_proxy(
    cluster: ClusterServer,
) -> None:
    a, b = connect(cluster.proxies[0]), connect(cluster.proxies[1])
    try:
        on_a, on_b = a.channel(), b.channel()
        on_a.queue_declare("passing", auto_delete=True)
        on_a.basic_consume("passing", ignore)
        tag = on_b.basic_consume("passing", ignore)
        on_b.basic_cancel(tag)  # B's last, not the cluster's: the queue stays
        assert consumers(cluster.proxies[1], "passing") == 1
        on_a.basic_cancel(on_a.consumer_tags[0])  # the cluster's last: gone everywhere
        wait_until(lambda: not exists(cluster.proxies[1], "passing"), DEADLINE_S, "the queue to go")

        # The last consumer on the other proxy goes: the queue goes too.
        on_a.queue_declare("passing-b", auto_delete=True)
        tag = on_b.basic_consume("passing-b", ignore)
        assert consumers(cluster.proxies[0], "passing-b") == 1
        on_b.basic_cancel(tag)
        wait_until(
            lambda: not exists(cluster.proxies[0], "passing-b"), DEADLINE_S, "the queue to go"
        )

        # Never consumed from: it stays, as in RabbitMQ.
        on_a.queue_declare("never-consumed", auto_delete=True)
        assert exists(cluster.proxies[1], "never-consumed")
    finally:
        a.close()
        b.close()


def test_an_auto_delete_queue_goes_when_the_proxy_of_its_last_consumer_is_killed(
    doomed: ClusterServer,
) -> None:
    cluster = doomed
    b = connect(cluster.proxies[1])
    b.channel().queue_declare("orphaned", auto_delete=True)
    b.channel().basic_consume("orphaned", ignore)
    assert consumers(cluster.proxies[0], "orphaned") == 1
    cluster.kill_proxy(1)
    # Its worker's lease (2 s) ends its consumer; a housekeeping sweep of the other proxy
    # (1 s) then deletes the queue.
    wait_until(
        lambda: not exists(cluster.proxies[0], "orphaned"),
        cluster.proxies[1].lease_ttl + 10,
        "the killed proxy's consumer to end with its lease, and its queue with it",
    )


def test_an_x_expires_queue_goes_once_unused_on_every_proxy(cluster: ClusterServer) -> None:
    a, b = connect(cluster.proxies[0]), connect(cluster.proxies[1])
    expires_ms = 2000
    try:
        a.channel().queue_declare("lapsing", arguments={"x-expires": expires_ms})
        # Used through B past x-expires (a consumer, then gets): A keeps it meanwhile.
        on_b = b.channel()
        tag = on_b.basic_consume("lapsing", ignore)
        b.sleep(expires_ms / 1000 * 1.5)  # the scenario: in use past x-expires
        assert exists(cluster.proxies[0], "lapsing")
        on_b.basic_cancel(tag)
        for _ in range(4):
            b.sleep(expires_ms / 1000 / 2)
            on_b.basic_get("lapsing")
        assert exists(cluster.proxies[0], "lapsing")
        # Unused now: gone within x-expires and a refresh period (a quarter), and a sweep.
        wait_until(
            lambda: not exists(cluster.proxies[0], "lapsing"), DEADLINE_S, "the queue to expire"
        )
        deleted_by = [
            proxy
            for proxy in cluster.proxies
            for line in proxy.lines
            if "event=amqp_queue_unused" in line and "lapsing" in line
        ]
        assert len(deleted_by) == 1, [p.log_tail() for p in cluster.proxies]

        # An exclusive queue is its connection's: that proxy expires it on its own clock.
        mine = a.channel()
        mine.queue_declare("mine", exclusive=True, arguments={"x-expires": expires_ms})
        assert refused(b.channel().queue_declare, "mine", passive=True) == 405

        def expired() -> bool:
            try:
                a.channel().queue_declare("mine", passive=True)
            except pika.exceptions.ChannelClosedByBroker as error:
                assert error.reply_code == 404, error
                return True
            return False

        wait_until(expired, DEADLINE_S, "the exclusive queue to expire")
    finally:
        a.close()
        b.close()


def test_with_etcd_unreachable_consumes_and_if_unused_deletes_are_refused(
    doomed: ClusterServer,
) -> None:
    cluster = doomed
    a = connect(cluster.proxies[0])
    try:
        a.channel().queue_declare("unknowable")
        cluster.own_etcd.stop()
        for exclusive in (True, False):
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as error:
                a.channel().basic_consume("unknowable", ignore, exclusive=exclusive)
            assert error.value.reply_code == 405
            assert "etcd" in error.value.reply_text and "try again" in error.value.reply_text
        assert refused(a.channel().queue_delete, "unknowable", if_unused=True) == 405
        # A count is a hint: this proxy's own, no consumer here.
        assert a.channel().queue_declare("unknowable", passive=True).method.consumer_count == 0
        cluster.own_etcd.restart()

        def consumed() -> bool:
            try:
                a.channel().basic_consume("unknowable", ignore, exclusive=True)
            except pika.exceptions.ChannelClosedByBroker as error:
                assert error.reply_code == 405, error
                return False
            return True

        wait_until(consumed, DEADLINE_S, "a consume once etcd is back", interval=0.2)
        assert consumers(cluster.proxies[1], "unknowable") == 1
    finally:
        a.close()


def test_a_deletion_cut_short_by_a_killed_proxy_leaves_keys_the_others_clear(
    tmp_path: Path,
) -> None:
    """The proxy deleting an auto-delete queue is SIGKILLed between the queue's delete and its
    consumer directory's: the other proxy clears what is left, and a new queue of the name
    behaves as any other."""
    reached = tmp_path / "reached"
    cluster = ClusterServer(tmp_path / "cluster")
    cluster.proxies[1].env = {failpoints.AMQP_ENV: f"queue-deleted-before-its-keys={reached}"}
    cluster.start()
    try:
        b = connect(cluster.proxies[1])
        on_b = b.channel()
        on_b.queue_declare("cutshort", auto_delete=True)
        tag = on_b.basic_consume("cutshort", ignore)
        assert any(key.endswith("/armed") for key in consumer_keys(cluster, "cutshort"))

        def cancel() -> None:  # its Cancel-Ok never comes: B stops while deleting the queue
            with contextlib.suppress(pika.exceptions.AMQPError):
                on_b.basic_cancel(tag)

        threading.Thread(target=cancel, daemon=True).start()
        wait_until(lambda: reached.exists() and reached.read_text(), DEADLINE_S, "the failpoint")
        os.kill(int(reached.read_text()), signal.SIGKILL)  # the worker that reached it
        cluster.kill_proxy(1)
        assert not exists(cluster.proxies[0], "cutshort")
        left = consumer_keys(cluster, "cutshort")
        assert any(key.endswith("/armed") for key in left), left  # the cut was real

        wait_until(
            lambda: not consumer_keys(cluster, "cutshort"),
            LEFTOVER_AFTER_S + cluster.proxies[1].lease_ttl + DEADLINE_S,
            "the other proxy to clear the directory left behind",
        )
        # A queue of the name again: counted, and gone with its last consumer as usual.
        a = connect(cluster.proxies[0])
        try:
            on_a = a.channel()
            on_a.queue_declare("cutshort", auto_delete=True)
            tag = on_a.basic_consume("cutshort", ignore)
            assert consumers(cluster.proxies[0], "cutshort") == 1
            on_a.basic_cancel(tag)
            wait_until(
                lambda: not exists(cluster.proxies[0], "cutshort"), DEADLINE_S, "the queue to go"
            )
        finally:
            a.close()
    finally:
        cluster.kill()


def _worker_holding(connection: pika.BlockingConnection, workers: list[int]) -> int | None:
    """Which of a proxy's worker processes holds ``connection``'s socket (its server end)."""
    client_port = connection._impl._transport._sock.getsockname()[1]  # noqa: SLF001
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].split(":")[1], 16) == client_port:  # remote end: the client
            inodes.add(f"socket:[{fields[9]}]")
    for pid in workers:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) in inodes:
                    return pid
    return None


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[ClusterServer]:
    """A cluster whose first proxy runs two worker processes sharing its ports."""
    server = ClusterServer(tmp_path / "cluster", workers=2).start()
    try:
        yield server
    finally:
        server.kill()


def test_the_workers_of_one_proxy_count_and_hold_queues_for_each_other(
    two_workers: ClusterServer,
) -> None:
    """Two workers of one proxy (the kernel hands each connection to one of them): a
    consumer on either counts on the other, an exclusive consumer on one holds the queue on
    the other, and an auto-delete queue goes with its last consumer, on whichever worker."""
    proxy = two_workers.proxies[0]
    assert proxy.proc is not None
    children = Path(f"/proc/{proxy.proc.pid}/task/{proxy.proc.pid}/children").read_text()
    workers = [int(pid) for pid in children.split()]
    assert len(workers) == 2, children
    by_worker: dict[int, pika.BlockingConnection] = {}
    spare = []
    for _ in range(64):  # until each worker holds one (each connection: one or the other)
        opened = connect(proxy)
        holder = _worker_holding(opened, workers)
        assert holder is not None
        if holder in by_worker:
            spare.append(opened)
        else:
            by_worker[holder] = opened
        if len(by_worker) == 2:
            break
    assert len(by_worker) == 2, "the kernel gave every connection to one worker"
    one, other = by_worker.values()
    try:
        on_one, on_other = one.channel(), other.channel()
        on_one.queue_declare("shared-by-workers", auto_delete=True)
        tag = on_one.basic_consume("shared-by-workers", ignore)
        assert on_other.queue_declare("shared-by-workers", passive=True).method.consumer_count == 1
        assert refused(other.channel().queue_delete, "shared-by-workers", if_unused=True) == 406

        on_other.queue_declare("held-by-a-worker")
        held = on_other.basic_consume("held-by-a-worker", ignore, exclusive=True)
        assert refused(one.channel().basic_consume, "held-by-a-worker", ignore) == 403
        on_other.basic_cancel(held)
        one.channel().basic_consume("held-by-a-worker", ignore)  # free once cancelled

        on_one.basic_cancel(tag)  # the last consumer, on the first worker: the queue goes
        wait_until(
            lambda: consumers(two_workers.proxies[1], "shared-by-workers") is None,
            DEADLINE_S,
            "the auto-delete queue to go with its last consumer",
        )
    finally:
        for connection in (one, other, *spare):
            if connection.is_open:
                connection.close()
