"""AMQP 0-9-1 through the proxies of a real cluster (etcd, two brokers, two proxies), with pika:
the topology declared through one proxy is the one every proxy routes on (it lives in etcd),
durable entities outlive the proxies, exclusive queues their connection only, and a
transaction's publishes to queues held by two brokers commit together."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from bench.commitlog_size import commit_log_end
from halfmoon.amqp.names import stored_name
from halfmoon.cluster.coordination.placement import place_queues
from tests.cluster.cluster_server import ClusterProxy, ClusterServer
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterServer]:
    """A cluster of this test's own: the restart test stops its proxies, another kills one."""
    server = ClusterServer(tmp_path / "cluster").start()
    try:
        yield server
    finally:
        if server.alive():
            server.stop()
        else:  # its first proxy was stopped or killed: end what is left of the cluster
            server.kill()


def connect(proxy: ClusterProxy) -> pika.BlockingConnection:
    assert proxy.amqp_address, proxy.log_tail()
    return pika.BlockingConnection(
        pika.URLParameters(f"amqp://guest:guest@{proxy.amqp_address}/%2F?heartbeat=0")
    )


def bodies(
    channel: pika.adapters.blocking_connection.BlockingChannel, queue: str, n: int
) -> list[bytes]:
    """The next ``n`` messages of ``queue``, consumed and acked (a generous deadline)."""
    got = []
    for method, _, body in channel.consume(queue, inactivity_timeout=30):
        assert method is not None, f"only {got} of {n} messages arrived from {queue!r}"
        got.append(body)
        channel.basic_ack(method.delivery_tag)
        if len(got) == n:
            break
    channel.cancel()
    return got


def test_topology_declared_through_one_proxy_routes_a_publish_through_another(
    cluster: ClusterServer,
) -> None:
    a, b = connect(cluster.proxies[0]), connect(cluster.proxies[1])
    try:
        on_a = a.channel()
        on_a.exchange_declare("orders", "topic", durable=True)
        on_a.queue_declare("paid", durable=True)
        on_a.queue_bind("paid", "orders", "order.paid.*")
        on_a.exchange_declare("audit", "fanout")  # transient: still every proxy's
        on_a.exchange_bind("audit", "orders", "order.#")
        on_a.queue_declare("audit-log")
        on_a.queue_bind("audit-log", "audit")

        on_b = b.channel()
        on_b.exchange_declare("orders", passive=True)  # seen at once, not after a watch
        on_b.confirm_delivery()
        for n in range(3):
            on_b.basic_publish(
                "orders", f"order.paid.{n}", b"paid-%d" % n, PERSISTENT, mandatory=True
            )  # confirmed: raises UnroutableError or NackError otherwise
        on_b.basic_publish("orders", "order.placed", b"placed", PERSISTENT, mandatory=True)

        assert bodies(on_a, "paid", 3) == [b"paid-0", b"paid-1", b"paid-2"]
        assert sorted(bodies(on_a, "audit-log", 4)) == [
            b"paid-0", b"paid-1", b"paid-2", b"placed"
        ]  # fmt: skip

        # Removals reach the other proxies through the watch (docs/cluster.md): an unbind
        # through B is what A routes on within moments.
        on_b.queue_unbind("paid", "orders", "order.paid.*")
        on_a.exchange_unbind("audit", "orders", "order.#")
        on_a.confirm_delivery()

        def unroutable_on_a() -> bool:
            try:
                on_a.basic_publish("orders", "order.paid.9", b"x", PERSISTENT, mandatory=True)
            except pika.exceptions.UnroutableError:
                return True
            return False

        wait_until(unroutable_on_a, timeout=30, what="A to hear of the unbind", interval=0.2)

        # A redeclare that differs is refused through either proxy.
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            b.channel().exchange_declare("orders", "direct", durable=True)
        assert refused.value.reply_code == 406
    finally:
        a.close()
        b.close()


def test_durable_topology_survives_restarting_every_proxy(cluster: ClusterServer) -> None:
    a = connect(cluster.proxies[0])
    on_a = a.channel()
    on_a.exchange_declare("kept", "direct", durable=True)
    on_a.queue_declare("kept-q", durable=True, arguments={"x-max-length": 100})
    on_a.queue_bind("kept-q", "kept", "k")
    on_a.exchange_declare("passing", "direct", durable=False)
    on_a.confirm_delivery()
    on_a.basic_publish("kept", "k", b"before", PERSISTENT, mandatory=True)
    a.close()

    # ClusterProxy's own stop and start: the cluster object's would take etcd and the
    # brokers along.
    for proxy in cluster.proxies:
        assert ClusterProxy.stop(proxy) == 0, proxy.log_tail()
    for proxy in reversed(cluster.proxies):
        ClusterProxy.start(proxy)

    b = connect(cluster.proxies[1])
    try:
        on_b = b.channel()
        on_b.exchange_declare("kept", passive=True)
        declared = on_b.queue_declare("kept-q", passive=True)
        assert declared.method.message_count == 1
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
            b.channel().exchange_declare("passing", passive=True)
        assert gone.value.reply_code == 404  # transient: ended with the proxy that declared it
        on_b.confirm_delivery()
        on_b.basic_publish("kept", "k", b"after", PERSISTENT, mandatory=True)
        # The arguments came back too: a redeclare without them differs.
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as differs:
            b.channel().queue_declare("kept-q", durable=True)
        assert differs.value.reply_code == 406
    finally:
        b.close()
    a = connect(cluster.proxies[0])
    try:
        assert bodies(a.channel(), "kept-q", 2) == [b"before", b"after"]
    finally:
        a.close()


def test_an_exclusive_queue_is_its_connections_but_reachable_from_every_proxy(
    cluster: ClusterServer,
) -> None:
    owner, other = connect(cluster.proxies[0]), connect(cluster.proxies[1])
    try:
        mine = owner.channel()
        reply_to = mine.queue_declare("", exclusive=True).method.queue
        # The RPC pattern: a server connected elsewhere answers on the default exchange.
        answering = other.channel()
        answering.confirm_delivery()
        answering.basic_publish("", reply_to, b"answer", mandatory=True)
        assert bodies(mine, reply_to, 1) == [b"answer"]

        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as locked:
            other.channel().basic_consume(reply_to, lambda *args: None)
        assert locked.value.reply_code == 405
    finally:
        owner.close()
    try:
        # Gone with its connection, for every proxy (deleted once the server has seen the
        # connection end, which is after its Close-Ok: a moment after close() returns).
        def gone() -> bool:
            try:
                other.channel().queue_declare(reply_to, passive=True)
            except pika.exceptions.ChannelClosedByBroker as error:
                assert error.reply_code == 404, error
                return True
            return False

        wait_until(gone, timeout=30, what="the exclusive queue to go with its connection")
    finally:
        other.close()


def _queue_on(broker: str, prefix: str) -> str:
    """An AMQP queue name whose halfmoon topic (one queue) is placed on ``broker``."""
    for n in range(100):
        name = f"{prefix}-{n}"
        (assignment,) = place_queues(stored_name("", name), 1, ["broker-a", "broker-b"])
        if assignment.broker == broker:
            return name
    raise AssertionError(f"no name placed on {broker}")


def test_a_transaction_through_a_proxy_commits_queues_on_two_brokers_together(
    cluster: ClusterServer,
) -> None:
    on_a, on_b = _queue_on("broker-a", "tx"), _queue_on("broker-b", "tx")
    a, b = connect(cluster.proxies[0]), connect(cluster.proxies[1])
    try:
        watcher = a.channel()
        for name in (on_a, on_b):
            watcher.queue_declare(name, durable=True)
        for name, broker in ((on_a, "broker-a"), (on_b, "broker-b")):
            status, route = cluster.admin_call("GET", f"/v1/topics/{stored_name('', name)}/route")
            assert status == 200, route
            assert {q["broker"] for q in route["queues"]} == {broker}  # type: ignore[index]

        tx = b.channel()
        tx.tx_select()
        tx.basic_publish("", on_a, b"first", PERSISTENT)
        tx.basic_publish("", on_b, b"second", PERSISTENT)
        tx.tx_rollback()
        tx.basic_publish("", on_a, b"kept-a", PERSISTENT)
        tx.basic_publish("", on_b, b"kept-b", PERSISTENT)
        # Nothing is visible before the commit, on either broker.
        for name in (on_a, on_b):
            assert watcher.queue_declare(name, passive=True).method.message_count == 0
        tx.tx_commit()
        # Commit-Ok came once the whole group was durable: both are there at once.
        counts = {
            name: watcher.queue_declare(name, passive=True).method.message_count
            for name in (on_a, on_b)
        }
        assert counts == {on_a: 1, on_b: 1}
        assert bodies(watcher, on_a, 1) == [b"kept-a"]
        assert bodies(watcher, on_b, 1) == [b"kept-b"]
    finally:
        a.close()
        b.close()


def test_a_fanout_across_two_brokers_is_stored_once_on_each(cluster: ClusterServer) -> None:
    on_a = [_queue_on("broker-a", f"fan{i}") for i in range(3)]
    on_b = [_queue_on("broker-b", f"fan{i}") for i in range(2)]
    body = b"fan-" * 1024
    count = 10
    connection = connect(cluster.proxies[0])
    try:
        channel = connection.channel()
        channel.exchange_declare("spread", "fanout", durable=True)
        for name in on_a + on_b:
            channel.queue_declare(name, durable=True)
            channel.queue_bind(name, "spread")
        broker_dirs = {
            "broker-a": cluster.data_dir / "broker-a",
            "broker-b": cluster.data_dir / "broker-b",
        }
        before = {name: commit_log_end(path) for name, path in broker_dirs.items()}
        channel.confirm_delivery()
        for n in range(count):
            channel.basic_publish("spread", "", body + b"%d" % n, PERSISTENT)  # confirmed
        grown = {name: commit_log_end(path) - before[name] for name, path in broker_dirs.items()}
        # One record per message on each broker (its queues' names listed in it), not one
        # per queue: broker-a holds three of the queues, broker-b two.
        for name, bytes_grown in grown.items():
            assert len(body) * count <= bytes_grown < 1.5 * len(body) * count, (name, grown)
        for name in on_a + on_b:
            assert sorted(bodies(channel, name, count)) == sorted(
                body + b"%d" % n for n in range(count)
            )
    finally:
        connection.close()


def test_a_proxy_that_dies_takes_its_transient_entities_with_it(cluster: ClusterServer) -> None:
    survivor = connect(cluster.proxies[1])
    victim = connect(cluster.proxies[0])
    victim.channel().queue_declare("", exclusive=True)
    doomed = victim.channel()
    doomed.exchange_declare("short-lived", "fanout")
    cluster.kill_proxy(0)
    try:
        probe = survivor.channel()

        def exchange_gone() -> bool:
            nonlocal probe
            try:
                probe.exchange_declare("short-lived", passive=True)
            except pika.exceptions.ChannelClosedByBroker as closed:
                assert closed.reply_code == 404
                probe = survivor.channel()
                return True
            return False

        wait_until(exchange_gone, timeout=30, what="the killed proxy's lease to end", interval=0.2)
    finally:
        survivor.close()


def test_workers_of_a_proxy_share_its_amqp_port_and_topology(tmp_path: Path) -> None:
    server = ClusterServer(tmp_path / "cluster", workers=2).start()
    try:
        connections = [connect(server) for _ in range(6)]  # spread over both workers
        try:
            first = connections[0].channel()
            first.exchange_declare("shared", "direct")
            first.queue_declare("shared-q")
            first.queue_bind("shared-q", "shared", "k")
            for n, connection in enumerate(connections[1:]):
                channel = connection.channel()
                channel.confirm_delivery()
                channel.basic_publish("shared", "k", b"%d" % n, mandatory=True)
            assert sorted(bodies(first, "shared-q", 5)) == [b"0", b"1", b"2", b"3", b"4"]
        finally:
            for connection in connections:
                connection.close()
    finally:
        server.stop()


def test_a_proxy_blocks_publishers_when_a_broker_is_short_of_disk(tmp_path: Path) -> None:
    # A limit no disk reaches: the brokers' disk_free_bytes (their facts in etcd) count
    # as short, nothing is filled.
    server = ClusterServer(
        tmp_path / "cluster", settings=("server.amqp_disk_free_limit_bytes=1000000000000000",)
    ).start()
    try:
        publisher = connect(server.proxies[1])
        try:
            blocked: list[object] = []
            publisher.add_on_connection_blocked_callback(lambda *_: blocked.append(True))
            channel = publisher.channel()
            channel.queue_declare("full")
            channel.basic_publish("", "full", b"x")

            def told() -> bool:
                publisher.process_data_events(time_limit=0.1)
                return bool(blocked)

            wait_until(told, timeout=30, what="Connection.Blocked from the proxy")
        finally:
            publisher._impl._transport._sock.close()  # type: ignore[attr-defined]  # not read
    finally:
        server.stop()


def test_definitions_imported_through_one_proxy_route_through_another(
    cluster: ClusterServer,
) -> None:
    first, second = cluster.proxies
    document = {
        "halfmoon_definitions": 1,
        "exchanges": [{"name": "invoices", "vhost": "/", "type": "direct", "durable": True}],
        "queues": [{"name": "invoices.due", "vhost": "/", "durable": True}],
        "bindings": [{"source": "invoices", "vhost": "/", "destination": "invoices.due",
                      "destination_type": "queue", "routing_key": "due"}],
    }  # fmt: skip
    code, answer = first.admin_call("POST", "/v1/definitions", document)
    assert code == 200 and answer["created"]["queues"] == ["invoices.due"], answer
    code, again = second.admin_call("POST", "/v1/definitions", document)  # read from etcd
    assert code == 200 and again["unchanged"]["bindings"] and not again["created"]["queues"]
    code, exported = second.admin_call("GET", "/v1/definitions")
    assert code == 200 and [q["name"] for q in exported["queues"]] == ["invoices.due"]

    connection = connect(second)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("invoices", "due", b"invoice 7", PERSISTENT, mandatory=True)
        assert bodies(channel, "invoices.due", 1) == [b"invoice 7"]
    finally:
        connection.close()
