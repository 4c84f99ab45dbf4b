"""The three services of the orders example, each with its own tables in one database.

- **orders**: places an order (order row + a half message bound to the same
  database transaction), confirms it when payment completes, cancels it when
  a compensation asks (only at the version the compensation saw).
- **inventory**: deducts stock once per order (inbox); out of stock, it asks
  the order service to cancel; releases stock when payment compensates.
- **payment**: charges once per order (inbox); declined, it asks orders to
  cancel and inventory to release.

Events travel as half messages on halfmoon (each service's sends are bound
to its own database transaction). Compensations travel on one halfmoon
topic, or on RabbitMQ queues with TTL retry tiers (``--amqp``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, insert, select, update

from halfmoon.client import Message, MessageView, TransactionProducer
from halfmoon.outbox.compensation import Compensation, apply_if_version
from halfmoon.outbox.inbox import DUPLICATE, Inbox
from halfmoon.outbox.txlog import TransactionalSender, TransactionLog

# Topic base names; the demo prefixes them per run (``topics`` maps base name -> topic).
ORDER_CREATED = "orders-created"
STOCK_RESERVED = "stock-reserved"
PAYMENT_DONE = "payment-done"
COMPENSATIONS = "compensations"  # one topic; the tag is the action, target_service says who acts
ALL_TOPICS = (ORDER_CREATED, STOCK_RESERVED, PAYMENT_DONE, COMPENSATIONS)
PAYMENT_LIMIT = 400


def body(**fields: Any) -> bytes:
    return json.dumps(fields, sort_keys=True).encode()


@dataclass
class Stats:
    """What the consumers saw, for the report."""

    deliveries: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    stale: int = 0
    seen_orders: set[str] = field(default_factory=set)

    def count(self, service: str, result: Any) -> None:
        self.deliveries[service] = self.deliveries.get(service, 0) + 1
        if result is DUPLICATE:
            self.duplicates[service] = self.duplicates.get(service, 0) + 1


class Schema:
    """Every table of the example under one run prefix."""

    def __init__(self, prefix: str) -> None:
        self.metadata = md = MetaData()
        self.orders = Table(
            f"{prefix}orders", md,
            Column("id", String(32), primary_key=True),
            Column("sku", String(32), nullable=False),
            Column("qty", Integer, nullable=False),
            Column("amount", Integer, nullable=False),
            Column("status", String(16), nullable=False),
            Column("version", Integer, nullable=False),
        )  # fmt: skip
        self.stock = Table(
            f"{prefix}stock",
            md,
            Column("sku", String(32), primary_key=True),
            Column("qty", Integer, nullable=False),
        )
        self.reservations = Table(
            f"{prefix}reservations", md,
            Column("order_id", String(32), primary_key=True),
            Column("qty", Integer, nullable=False),
            Column("status", String(16), nullable=False),
            Column("version", Integer, nullable=False),
        )  # fmt: skip
        self.payments = Table(
            f"{prefix}payments",
            md,
            Column("order_id", String(32), primary_key=True),
            Column("amount", Integer, nullable=False),
        )
        self.order_log = TransactionLog(table_prefix=f"{prefix}orders_", metadata=md)
        self.inventory_log = TransactionLog(table_prefix=f"{prefix}inventory_", metadata=md)
        self.payment_log = TransactionLog(table_prefix=f"{prefix}payment_", metadata=md)
        self.orders_inbox = Inbox("orders", table_prefix=prefix, metadata=md)
        self.inventory_inbox = Inbox("inventory", table_prefix=prefix, metadata=md)
        self.payment_inbox = Inbox("payment", table_prefix=prefix, metadata=md)


class Compensations:
    """Where compensations go: a halfmoon topic per target, or RabbitMQ retry queues."""

    def __init__(self, topics: dict[str, str], rabbit: dict[str, Any] | None = None) -> None:
        self.topics = topics
        self.rabbit = rabbit  # target service -> RabbitRetryQueue

    async def send(self, tx: Any, compensation: Compensation) -> None:
        if self.rabbit is not None:
            # Published before the sender's commit: compensations are idempotent and
            # version-checked, so a publish whose transaction then fails does no harm.
            await self.rabbit[compensation.target_service].publish_compensation(compensation)
            return
        await tx.send_async(compensation.to_message(self.topics[COMPENSATIONS]))


class OrderService:
    def __init__(
        self,
        engine: Engine,
        schema: Schema,
        producer: TransactionProducer,
        topics: dict[str, str],
        stats: Stats,
    ) -> None:
        self.engine, self.s, self.stats, self.topics = engine, schema, stats, topics
        self.sender = TransactionalSender(producer, schema.order_log)

    async def place(
        self, order_id: str, sku: str, qty: int, amount: int, *, fail_locally: bool = False
    ) -> bool:
        """Order row and ORDER_CREATED together; ``fail_locally`` rolls both back after the send."""
        try:
            async with self.sender.atransaction(self.engine) as tx:
                tx.conn.execute(
                    insert(self.s.orders).values(
                        id=order_id, sku=sku, qty=qty, amount=amount, status="pending", version=1
                    )
                )
                await tx.send_async(
                    Message(
                        self.topics[ORDER_CREATED],
                        body(order_id=order_id, sku=sku, qty=qty, amount=amount, version=1),
                        keys=[order_id],
                    )
                )
                if fail_locally:
                    raise ValueError("address validation failed")
        except ValueError:
            return False
        return True

    def on_payment_done(self, message: MessageView) -> None:
        event = json.loads(message.body)
        o = self.s.orders

        @self.s.orders_inbox.handler(self.engine, key=lambda m: f"payment-done:{event['order_id']}")
        def confirm(conn: Any, m: MessageView) -> None:
            self.stats.seen_orders.add(event["order_id"])
            conn.execute(
                update(o)
                .where(o.c.id == event["order_id"], o.c.status == "pending")
                .values(status="confirmed", version=o.c.version + 1)
            )

        self.stats.count("orders", confirm(message))

    def on_compensation(self, comp: Compensation) -> None:
        o = self.s.orders

        @self.s.orders_inbox.handler(self.engine, key=lambda c: c.idempotency_key)
        def cancel(conn: Any, c: Compensation) -> None:
            applied = apply_if_version(
                conn,
                o,
                key={"id": c.business_key},
                version_column="version",
                expected_version=c.state_version,
                values={"status": "cancelled"},
            )
            if not applied:
                self.stats.stale += 1

        self.stats.count("orders-compensation", cancel(comp))


class InventoryService:
    def __init__(
        self,
        engine: Engine,
        schema: Schema,
        producer: TransactionProducer,
        compensations: Compensations,
        stats: Stats,
    ) -> None:
        self.engine, self.s, self.stats, self.compensations = engine, schema, stats, compensations
        self.topics = compensations.topics
        self.sender = TransactionalSender(producer, schema.inventory_log)

    async def on_order_created(self, message: MessageView) -> None:
        event = json.loads(message.body)
        order_id = event["order_id"]
        s = self.s
        async with self.sender.atransaction(self.engine) as tx:
            if not s.inventory_inbox.claim(tx.conn, f"order-created:{order_id}"):
                self.stats.count("inventory", DUPLICATE)
                return
            self.stats.count("inventory", None)
            self.stats.seen_orders.add(order_id)
            deducted = tx.conn.execute(
                update(s.stock)
                .where(s.stock.c.sku == event["sku"], s.stock.c.qty >= event["qty"])
                .values(qty=s.stock.c.qty - event["qty"])
            ).rowcount
            if deducted:
                tx.conn.execute(
                    insert(s.reservations).values(
                        order_id=order_id, qty=event["qty"], status="reserved", version=1
                    )
                )
                await tx.send_async(
                    Message(self.topics[STOCK_RESERVED], body(**event), keys=[order_id])
                )
            else:
                comp = Compensation.new(
                    "orders",
                    "cancel_order",
                    order_id,
                    event["version"],
                    "inventory.out_of_stock",
                    original_event_id=message.message_id,
                )
                await self.compensations.send(tx, comp)

    def on_compensation(self, comp: Compensation) -> None:
        s = self.s

        @s.inventory_inbox.handler(self.engine, key=lambda c: c.idempotency_key)
        def release(conn: Any, c: Compensation) -> None:
            r = s.reservations
            qty = conn.execute(select(r.c.qty).where(r.c.order_id == c.business_key)).scalar()
            if qty is None or not apply_if_version(
                conn,
                r,
                key={"order_id": c.business_key},
                version_column="version",
                expected_version=c.state_version,
                values={"status": "released"},
            ):
                self.stats.stale += 1
                return
            conn.execute(update(s.stock).values(qty=s.stock.c.qty + qty))

        self.stats.count("inventory-compensation", release(comp))


class PaymentService:
    def __init__(
        self,
        engine: Engine,
        schema: Schema,
        producer: TransactionProducer,
        compensations: Compensations,
        stats: Stats,
    ) -> None:
        self.engine, self.s, self.stats, self.compensations = engine, schema, stats, compensations
        self.topics = compensations.topics
        self.sender = TransactionalSender(producer, schema.payment_log)

    async def on_stock_reserved(self, message: MessageView) -> None:
        event = json.loads(message.body)
        order_id = event["order_id"]
        async with self.sender.atransaction(self.engine) as tx:
            if not self.s.payment_inbox.claim(tx.conn, f"stock-reserved:{order_id}"):
                self.stats.count("payment", DUPLICATE)
                return
            self.stats.count("payment", None)
            if event["amount"] <= PAYMENT_LIMIT:
                tx.conn.execute(
                    insert(self.s.payments).values(order_id=order_id, amount=event["amount"])
                )
                await tx.send_async(
                    Message(self.topics[PAYMENT_DONE], body(order_id=order_id), keys=[order_id])
                )
            else:
                trace = message.message_id
                await self.compensations.send(
                    tx,
                    Compensation.new(
                        "orders",
                        "cancel_order",
                        order_id,
                        event["version"],
                        "payment.declined",
                        original_event_id=trace,
                    ),
                )
                await self.compensations.send(
                    tx,
                    Compensation.new(
                        "inventory",
                        "release_stock",
                        order_id,
                        1,
                        "payment.declined",
                        original_event_id=trace,
                    ),
                )
