"""Compensations: the format, stale ones skipped, retries then the alert on halfmoon and on
RabbitMQ."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
from sqlalchemy import Column, Engine, Integer, String, Table, insert, select

from halfmoon.cli.admin_client import AdminClient
from halfmoon.client import (
    Message,
    MessageSelector,
    SyncProducer,
    SyncPushConsumer,
    SyncSimpleConsumer,
)
from halfmoon.outbox.compensation import (
    ATTEMPTS_HEADER,
    Compensation,
    InvalidCompensation,
    RabbitRetryQueue,
    alert_topic,
    apply_if_version,
    compensation_listener,
    create_compensation_group,
)
from halfmoon.outbox.inbox import DUPLICATE, Inbox
from tests.outbox import toolkit_support
from tests.server.conftest import ServerProcess, server

engine, prefix = toolkit_support.engine, toolkit_support.prefix
__all__ = ["server"]


def cancel_order(version: int = 1, key: str = "order-1") -> Compensation:
    return Compensation.new(
        "orders", "cancel_order", key, version, "inventory.out_of_stock", original_event_id="evt-9"
    )


def test_format_round_trips_and_refuses_business_data() -> None:
    comp = cancel_order()
    assert Compensation.from_bytes(comp.to_bytes()) == comp
    assert comp.idempotency_key == "compensation:orders:cancel_order:order-1:1"
    message = comp.to_message("compensations")
    assert message.tag == "cancel_order" and message.keys == ["order-1", comp.trace_id]
    with pytest.raises(InvalidCompensation, match="unknown compensation field"):
        Compensation.from_bytes(
            comp.to_bytes().replace(b'"action"', b'"card_number":"4111","action"')
        )
    with pytest.raises(InvalidCompensation, match="business_key"):
        Compensation.new("orders", "cancel_order", "", 1, "evt")
    with pytest.raises(InvalidCompensation, match="state_version"):
        Compensation.new("orders", "cancel_order", "k", -1, "evt")
    with pytest.raises(InvalidCompensation, match="JSON"):
        Compensation.from_bytes(b"not json")


def test_stale_compensation_is_skipped_and_a_current_one_applied_once(
    engine: Engine, prefix: str
) -> None:
    inbox = Inbox("orders", table_prefix=prefix)
    orders = Table(
        f"{prefix}orders",
        inbox.metadata,
        Column("id", String(32), primary_key=True),
        Column("status", String(16)),
        Column("version", Integer, nullable=False),
    )
    inbox.metadata.create_all(engine)

    @inbox.handler(engine, key=lambda comp: comp.idempotency_key)
    def handle(conn, comp: Compensation) -> bool:
        return apply_if_version(
            conn,
            orders,
            key={"id": comp.business_key},
            version_column="version",
            expected_version=comp.state_version,
            values={"status": "cancelled"},
        )

    try:
        with engine.begin() as conn:
            conn.execute(insert(orders).values(id="order-1", status="paid", version=2))
        assert handle(cancel_order(version=1)) is False  # the order moved on: stale, skipped
        assert handle(cancel_order(version=2)) is True
        assert handle(cancel_order(version=2)) is DUPLICATE  # redelivered
        with engine.connect() as conn:
            assert tuple(conn.execute(select(orders.c.status, orders.c.version)).one()) == (
                "cancelled",
                3,
            )
    finally:
        inbox.metadata.drop_all(engine)


def test_halfmoon_retries_with_the_group_policy_then_dead_letters(server: ServerProcess) -> None:
    topic, group, reader = (
        f"comp-{uuid.uuid4().hex[:8]}",
        f"comp-g-{uuid.uuid4().hex[:8]}",
        f"dlq-{uuid.uuid4().hex[:8]}",
    )
    server.create_topic(topic)
    tiers = (0.1, 0.2, 0.3, 0.4)
    created = create_compensation_group(AdminClient(server.admin), group, tiers=tiers)
    assert created["max_delivery_attempts"] == 5
    again = create_compensation_group(
        AdminClient(server.admin), group, tiers=tiers
    )  # idempotent: updates
    assert again["max_delivery_attempts"] == 5
    server.create_group(reader)
    attempts: list[tuple[int, float]] = []
    handled: list[Compensation] = []

    def always_fails(comp: Compensation, message) -> None:
        handled.append(comp)
        attempts.append((message.delivery_attempt, time.monotonic()))
        raise RuntimeError("the order service is down")

    comp = cancel_order()
    with (
        SyncProducer(server.grpc) as producer,
        SyncPushConsumer(
            server.grpc, group, {topic: MessageSelector.all()}, compensation_listener(always_fails)
        ) as consumer,
    ):
        producer.send(comp.to_message(topic))
        deadline = time.monotonic() + 30
        while consumer.client.dead_lettered < 1:
            assert time.monotonic() < deadline, f"never dead-lettered; attempts {attempts}"
            time.sleep(0.05)
    assert [a for a, _ in attempts] == [1, 2, 3, 4, 5]
    assert handled == [comp] * 5
    # The waits grow with the tiers (the client adds nothing below them).
    gaps = [
        later - earlier for (_, earlier), (_, later) in zip(attempts, attempts[1:], strict=False)
    ]
    assert all(gap >= tier * 0.9 for gap, tier in zip(gaps, tiers, strict=True)), gaps
    with SyncSimpleConsumer(
        server.grpc, reader, {alert_topic(group): MessageSelector.all()}
    ) as alerts:
        dead = []
        deadline = time.monotonic() + 10
        while not dead and time.monotonic() < deadline:
            dead = alerts.receive(4, 20, wait=0.5)
        assert [Compensation.from_message(m) for m in dead] == [comp]


def test_not_a_compensation_is_retried_into_the_alert_too(server: ServerProcess) -> None:
    topic, group = f"comp-{uuid.uuid4().hex[:8]}", f"comp-g-{uuid.uuid4().hex[:8]}"
    server.create_topic(topic)
    create_compensation_group(AdminClient(server.admin), group, tiers=(0.05,))
    called = threading.Event()
    with (
        SyncProducer(server.grpc) as producer,
        SyncPushConsumer(
            server.grpc,
            group,
            {topic: MessageSelector.all()},
            compensation_listener(lambda c, m: called.set()),
        ) as consumer,
    ):
        producer.send(Message(topic, b'{"v":1,"secret":"x"}'))
        deadline = time.monotonic() + 20
        while consumer.client.dead_lettered < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert not called.is_set()


def test_rabbitmq_tiers_count_attempts_then_alert(amqp_url: str) -> None:
    import aio_pika

    tiers = (0.05, 0.1, 0.2)

    async def scenario() -> None:
        connection = await aio_pika.connect_robust(amqp_url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            retry = RabbitRetryQueue(channel, f"hm-test-comp-{uuid.uuid4().hex[:8]}", tiers=tiers)
            await retry.declare()
            try:
                seen: dict[str, list[tuple[int, float]]] = {}
                flaky_done = asyncio.Event()

                async def handler(message, attempts: int) -> None:
                    comp = Compensation.from_bytes(message.body)
                    seen.setdefault(comp.business_key, []).append((attempts, time.monotonic()))
                    if comp.business_key == "poison" or attempts < 1:
                        raise RuntimeError("cannot compensate yet")
                    flaky_done.set()

                await retry.consume(handler)
                await retry.publish_compensation(cancel_order(key="poison"))
                await retry.publish_compensation(cancel_order(key="flaky"))
                alert_queue = await channel.get_queue(retry.alert_queue)
                alert = None
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 15
                while alert is None:
                    assert loop.time() < deadline, f"nothing reached the alert queue; seen {seen}"
                    alert = await alert_queue.get(fail=False)
                    if alert is None:
                        await asyncio.sleep(0.05)
                await alert.ack()
                await asyncio.wait_for(flaky_done.wait(), 10)
                assert Compensation.from_bytes(alert.body).business_key == "poison"
                assert alert.headers[ATTEMPTS_HEADER] == len(tiers) + 1
                assert alert.headers["halfmoon-last-error"] == "RuntimeError"
                assert [a for a, _ in seen["poison"]] == [0, 1, 2, 3]
                assert [a for a, _ in seen["flaky"]] == [0, 1]
                # Each retry waited at least its tier's TTL.
                times = [t for _, t in seen["poison"]]
                gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
                assert all(gap >= tier * 0.9 for gap, tier in zip(gaps, tiers, strict=True)), gaps
                assert await alert_queue.get(fail=False) is None  # the flaky one never alerted
                assert (retry.retried, retry.alerted) == (4, 1)
            finally:
                await retry.delete()

    asyncio.run(asyncio.wait_for(scenario(), 60))
