"""``message get ID --group G --client C`` through a proxy the client is not connected to.

A real cluster (etcd, two brokers, two proxies). The consumer connects to one
proxy only and the admin request goes to the other, which relays the command
through etcd to the worker holding the client's stream
(halfmoon/cluster/proxy/command_relay.py). Also: a proxy with two workers on one
port answers whichever worker the request reaches, an unknown client is
CLIENT_NOT_CONNECTED everywhere, a silent client is CLIENT_DID_NOT_ANSWER, and
a killed owner ends in PROXY_WORKER_DID_NOT_ANSWER within the deadline.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

from halfmoon.client import (
    ConsumeResult,
    Message,
    MessageSelector,
    MessageView,
    SyncProducer,
    SyncPushConsumer,
)
from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.proxy.command_relay import FORWARD_MARGIN_S
from halfmoon.cluster.proxy.session_directory import sessions_prefix
from tests.cluster.cluster_server import ClusterProxy, ClusterServer
from tests.server.conftest import unique, wait_until


def topic_and_group(cluster: ClusterServer) -> tuple[str, str]:
    topic, group = unique("orders"), unique("billing")
    cluster.create_topic(topic, "normal", queues=1)
    cluster.create_group(group)
    return topic, group


def sent(cluster: ClusterServer, topic: str, body: bytes) -> str:
    with SyncProducer(cluster.grpc, topics=[topic]) as producer:
        return producer.send(Message(topic, body)).message_id


def listed_by(proxy: ClusterProxy, group: str, client_id: str) -> dict[str, Any]:
    """The client as ``proxy`` lists it, once its worker has published it with its stream."""

    def find() -> dict[str, Any] | None:
        code, body = proxy.admin_call("GET", f"/v1/groups/{group}/clients")
        assert code == 200 and isinstance(body, dict), body
        found = [c for c in body["clients"] if c["client_id"] == client_id and c["stream"]]
        return found[0] if found else None

    return wait_until(find, 15, f"{client_id} listed by the proxy at {proxy.admin}")  # type: ignore[return-value]


def only_streaming_client(proxy: ClusterProxy, group: str) -> str:
    """The id of the one client of ``group`` with a stream, as ``proxy`` lists it."""

    def find() -> list[str] | None:
        code, body = proxy.admin_call("GET", f"/v1/groups/{group}/clients")
        assert code == 200 and isinstance(body, dict), body
        return [c["client_id"] for c in body["clients"] if c["stream"]] or None

    (client_id,) = wait_until(find, 15, f"a client of {group} listed with its stream")  # type: ignore[misc]
    return str(client_id)


def consume(
    proxy: ClusterProxy, message_id: str, group: str, client_id: str, timeout_ms: int = 5000
) -> tuple[int, Any]:
    return proxy.admin_call(
        "POST",
        f"/v1/messages/{message_id}/consume",
        {"group": group, "client_id": client_id, "timeout_ms": timeout_ms},
    )


class Listener:
    """A push consumer's listener that records what it ran on and refuses ``b"refuse"``."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()

    def __call__(self, message: MessageView) -> ConsumeResult:
        with self.lock:
            self.seen.append((message.message_id, message.body))
        return ConsumeResult.LATER if message.body == b"refuse" else ConsumeResult.SUCCESS

    def count(self, message_id: str) -> int:
        with self.lock:
            return sum(1 for seen_id, _ in self.seen if seen_id == message_id)


def relayed(proxy: ClusterProxy) -> list[str]:
    return [line for line in proxy.lines if "event=relayed_command" in line]


def test_the_other_proxy_relays_the_command_to_the_consumer_and_returns_its_answer(
    cluster: ClusterServer,
) -> None:
    topic, group = topic_and_group(cluster)
    holder, other = cluster.proxies
    listener = Listener()
    with SyncPushConsumer(
        holder.address, group, {topic: MessageSelector.all()}, listener, consume_from="earliest"
    ) as consumer:
        client_id = consumer.client.client_id
        assert listed_by(other, group, client_id)["worker"].startswith(f"proxy-{holder.grpc_port}/")
        message_id = sent(cluster, topic, b"hello")
        wait_until(lambda: listener.count(message_id) == 1, 15, "the message received once")

        code, answer = consume(other, message_id, group, client_id)
        assert code == 200, answer
        assert answer == {
            "message_id": message_id,
            "topic": topic,
            "group": group,
            "client_id": client_id,
            "consumed": True,
            "code": "OK",
            "message": "consumed by the listener",
        }
        assert listener.count(message_id) == 2  # received once, consumed again once
        # The holder ran it (the other proxy has no stream of this client to use).
        assert any(f"client_id={client_id} outcome=OK" in line for line in relayed(holder))
        assert not relayed(other)

        refused = sent(cluster, topic, b"refuse")
        wait_until(lambda: listener.count(refused) >= 1, 15, "the refused message received")
        done = other.cli("message", "get", refused, "--group", group, "--client", client_id)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == (
            f"client {client_id} of group '{group}' did not consume it "
            "(FAILED_TO_CONSUME_MESSAGE): the listener answered LATER (or raised)"
        )


def test_a_client_connected_nowhere_or_in_another_group_is_not_connected(
    cluster: ClusterServer,
) -> None:
    topic, group = topic_and_group(cluster)
    _, other_group = topic_and_group(cluster)
    holder, other = cluster.proxies
    message_id = sent(cluster, topic, b"x")
    with SyncPushConsumer(
        holder.address, group, {topic: MessageSelector.all()}, Listener(), consume_from="latest"
    ) as consumer:
        client_id = consumer.client.client_id
        listed_by(other, group, client_id)
        for asked_group, asked_client in ((group, "nobody"), (other_group, client_id)):
            code, answer = consume(other, message_id, asked_group, asked_client)
            assert code == 404, answer
            assert answer["error"]["code"] == "CLIENT_NOT_CONNECTED", answer
            assert "connected to any proxy" in answer["error"]["message"], answer


def test_a_worker_the_client_left_sends_the_command_on_to_the_next_one_listed(
    cluster: ClusterServer,
) -> None:
    """The directory still lists the client on a worker it left (a stale entry, first in
    key order): that worker answers CLIENT_NOT_CONNECTED and the next one listed runs it."""
    topic, group = topic_and_group(cluster)
    _, bystanders = topic_and_group(cluster)
    holder, other = cluster.proxies
    listener = Listener()
    with (
        SyncPushConsumer(
            holder.address, group, {topic: MessageSelector.all()}, listener,
            consume_from="earliest",
        ) as consumer,
        SyncPushConsumer(  # only to learn the name of the other proxy's worker
            other.address, bystanders, {topic: MessageSelector.all()}, Listener(),
            consume_from="latest",
        ) as bystander,
    ):  # fmt: skip
        client_id = consumer.client.client_id
        listed_by(other, group, client_id)
        other_worker = listed_by(holder, bystanders, bystander.client.client_id)["worker"]
        stale = {"client_id": client_id, "group": group, "stream": True, "worker": other_worker}

        async def plant() -> None:
            async with EtcdClient.from_url(cluster.own_etcd.url) as client:
                lease = await client.grant_lease(60)
                key = sessions_prefix(cluster.cluster) + "0-stale/1"  # sorts before the others
                await client.put(key, json.dumps([stale]).encode(), lease=lease)

        asyncio.run(plant())
        message_id = sent(cluster, topic, b"moved")
        wait_until(lambda: listener.count(message_id) == 1, 15, "the message received once")
        code, answer = consume(other, message_id, group, client_id)
        assert code == 200, answer
        assert answer["consumed"] is True, answer
        assert listener.count(message_id) == 2
        # Relayed to itself through etcd first (the stale entry), then to the holder.
        assert any(f"client_id={client_id} outcome=CLIENT_NOT_CONNECTED" in line
                   for line in relayed(other)), relayed(other)  # fmt: skip
        assert any(f"client_id={client_id} outcome=OK" in line for line in relayed(holder))


def test_a_client_that_ignores_the_command_times_out_through_the_relay(
    cluster: ClusterServer,
) -> None:
    topic, group = topic_and_group(cluster)
    holder, other = cluster.proxies
    message_id = sent(cluster, topic, b"x")
    # The official Python client 5.1.2 ignores VerifyMessageCommand.
    consumer = SimpleConsumer(
        ClientConfiguration(holder.address, Credentials(), request_timeout=5),
        group,
        {topic: FilterExpression()},
        await_duration=1,
    )
    consumer.startup()
    try:
        client_id = only_streaming_client(other, group)
        code, answer = consume(other, message_id, group, client_id, timeout_ms=500)
        assert code == 500, answer
        assert answer["error"]["code"] == "CLIENT_DID_NOT_ANSWER", answer
        assert "did not answer within 0.5 s" in answer["error"]["message"], answer
    finally:
        consumer.shutdown()


def test_a_proxy_with_two_workers_answers_from_either(
    cluster: ClusterServer, tmp_path: Path
) -> None:
    proxy = ClusterProxy(
        tmp_path / "workers", cluster.own_etcd, cluster.cluster, workers=2,
        settings=cluster.settings,
    ).start()  # fmt: skip
    try:
        wait_until(
            lambda: sum("halfmoon ready" in line for line in proxy.lines) == 2,
            30,
            "both workers ready",
        )
        topic, group = topic_and_group(cluster)
        listener = Listener()
        with SyncPushConsumer(
            proxy.address, group, {topic: MessageSelector.all()}, listener, consume_from="latest"
        ) as consumer:
            client_id = consumer.client.client_id
            worker = listed_by(cluster, group, client_id)["worker"]
            message_id = sent(cluster, topic, b"again")
            # Each admin call is a new connection, which the kernel gives to either worker:
            # call until one reached the worker without the client (it relayed), each answered.
            calls = 0
            while not relayed(proxy):
                assert calls < 40, "no call reached the worker without the client"
                code, answer = consume(proxy, message_id, group, client_id)
                assert code == 200 and answer["consumed"] is True, answer
                calls += 1
            assert all(f"worker={worker} " in line for line in relayed(proxy))
            assert listener.count(message_id) >= calls
    finally:
        assert proxy.stop() == 0, proxy.log_tail()


def test_a_killed_owner_ends_in_a_clear_error_within_the_deadline(
    cluster: ClusterServer, tmp_path: Path
) -> None:
    # Its entries outlive it by a lease long enough that the directory still names it.
    doomed = ClusterProxy(
        tmp_path / "doomed", cluster.own_etcd, cluster.cluster, lease_ttl=30,
        settings=cluster.settings,
    ).start()  # fmt: skip
    topic, group = topic_and_group(cluster)
    message_id = sent(cluster, topic, b"x")
    consumer = SyncPushConsumer(
        doomed.address, group, {topic: MessageSelector.all()}, Listener(), consume_from="latest"
    )
    consumer.start()
    try:
        client_id = consumer.client.client_id
        listed_by(cluster.proxies[1], group, client_id)
        doomed.kill()  # SIGKILL
        started = time.monotonic()
        code, answer = consume(cluster.proxies[1], message_id, group, client_id, timeout_ms=500)
        elapsed = time.monotonic() - started
        assert code == 500, answer
        assert answer["error"]["code"] == "PROXY_WORKER_DID_NOT_ANSWER", answer
        assert f"proxy-{doomed.grpc_port}/" in answer["error"]["message"], answer
        assert elapsed < 0.5 + FORWARD_MARGIN_S + 2, elapsed
    finally:
        consumer.close()
