"""Run the orders example end to end and print a consistency report.

    python examples/orders/demo.py                       # SQLite + a halfmoon serve of its own
    python examples/orders/demo.py --db postgresql+psycopg://postgres@127.0.0.1/test \\
                                   --amqp amqp://guest:guest@127.0.0.1:5672/

Exit status 0 when the report is consistent, 1 when it is not, 2 on a setup error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import consistency_report  # noqa: E402
from services import (  # noqa: E402
    ALL_TOPICS,
    COMPENSATIONS,
    ORDER_CREATED,
    PAYMENT_DONE,
    STOCK_RESERVED,
    Compensations,
    InventoryService,
    OrderService,
    PaymentService,
    Schema,
    Stats,
)

from halfmoon.cli.admin_client import AdminClient  # noqa: E402
from halfmoon.client import MessageSelector, PushConsumer, SimpleConsumer, TransactionProducer  # noqa: E402
from halfmoon.outbox.checker import TransactionLogChecker  # noqa: E402
from halfmoon.outbox.compensation import (  # noqa: E402
    Compensation,
    RabbitRetryQueue,
    compensation_listener,
    create_compensation_group,
)
from halfmoon.outbox.dialects import make_engine  # noqa: E402

STOCK = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    """A ``halfmoon serve`` in a temporary directory (or an existing one given by flags)."""

    def __init__(self, grpc: str | None, admin: str | None) -> None:
        self.grpc, self.admin = grpc, admin
        self.proc: subprocess.Popen[str] | None = None
        self.tmp: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> Broker:
        if self.grpc:
            return self
        self.tmp = tempfile.TemporaryDirectory(prefix="halfmoon-orders-")
        grpc_port, admin_port = free_port(), free_port()
        self.grpc, self.admin = f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{admin_port}"
        cmd = [
            sys.executable,
            "-m",
            "halfmoon",
            "serve",
            "--data-dir",
            self.tmp.name,
            "--listen",
            self.grpc,
            "--admin-listen",
            f"127.0.0.1:{admin_port}",
            "--set",
            "store.segment_size=16MiB",
            "--set",
            "transaction.check_interval_ms=1000",
            "--set",
            "transaction.timeout_ms=1000",
        ]
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        ready = threading.Event()
        lines: list[str] = []

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.append(line)
                if "halfmoon ready" in line:
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + 30
        while not ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("halfmoon serve did not start:\n" + "".join(lines[-20:]))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.tmp is not None:
            self.tmp.cleanup()


def orders_to_place(count: int, seed: int) -> list[dict[str, Any]]:
    """Deterministic orders: some run the stock out, some exceed the payment limit, some fail
    locally."""
    rng = random.Random(seed)
    return [
        {
            "order_id": f"o{i:03d}",
            "qty": rng.randint(1, 4),
            "amount": rng.choice([120, 250, 380, 520]),
            "fail_locally": i % 7 == 3,
        }
        for i in range(count)
    ]


async def run(args: argparse.Namespace) -> int:
    prefix = f"ex{uuid.uuid4().hex[:6]}_"
    tmpdir = tempfile.TemporaryDirectory(prefix="orders-db-")
    db_url = args.db or f"sqlite:///{Path(tmpdir.name) / 'orders.db'}"
    engine = make_engine(db_url)
    schema = Schema(prefix)
    schema.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(schema.stock.insert().values(sku="widget", qty=STOCK))
    stats = Stats()
    rabbit_connection = None
    with Broker(args.broker, args.admin) as broker:
        admin = AdminClient(broker.admin)
        run_tag = prefix.rstrip("_")
        topic = {name: f"{run_tag}-{name}" for name in ALL_TOPICS}
        for name in topic.values():
            admin.post(
                "/v1/topics", {"name": name, "message_type": "transaction", "queue_count": 2}
            )
        for name in (ORDER_CREATED, STOCK_RESERVED, PAYMENT_DONE):
            admin.post("/v1/groups", {"name": f"{run_tag}-{name}-g", "consume_from": "earliest"})

        def producer(service: str, log: Any, sends: list[str]) -> TransactionProducer:
            return TransactionProducer(
                broker.grpc,
                f"{run_tag}-{service}",
                TransactionLogChecker(engine, log),
                topics=[topic[t] for t in sends],
            )

        order_p = producer("orders", schema.order_log, [ORDER_CREATED])
        inventory_p = producer("inventory", schema.inventory_log, [STOCK_RESERVED, COMPENSATIONS])
        payment_p = producer("payment", schema.payment_log, [PAYMENT_DONE, COMPENSATIONS])
        for p in (order_p, inventory_p, payment_p):
            await p.start()
        rabbit: dict[str, RabbitRetryQueue] | None = None
        if args.amqp:
            import aio_pika

            rabbit_connection = await aio_pika.connect_robust(args.amqp)
            channel = await rabbit_connection.channel(publisher_confirms=True)
            rabbit = {
                target: RabbitRetryQueue(
                    channel, f"{run_tag}.compensate-{target}", tiers=(1, 5, 30, 180)
                )
                for target in ("orders", "inventory")
            }
            for queue in rabbit.values():
                await queue.declare()
        orders_svc = OrderService(engine, schema, order_p, topic, stats)
        inventory_svc = InventoryService(
            engine, schema, inventory_p, Compensations(topic, rabbit), stats
        )
        payment_svc = PaymentService(engine, schema, payment_p, Compensations(topic, rabbit), stats)

        compensation_consumers: list[Any] = []
        if rabbit is not None:

            async def via_rabbit(handler: Any) -> Any:
                async def handle(message: Any, attempts: int) -> None:
                    handler(Compensation.from_bytes(message.body))

                return handle

            await rabbit["orders"].consume(await via_rabbit(orders_svc.on_compensation))
            await rabbit["inventory"].consume(await via_rabbit(inventory_svc.on_compensation))
        else:
            # One consumer group with the compensation retry policy (1 s, 5 s, 30 s, 3 min, then
            # the dead-letter topic), dispatching on the target service.
            group = f"{run_tag}-{COMPENSATIONS}-g"
            create_compensation_group(AdminClient(broker.admin), group)
            handlers = {
                "orders": orders_svc.on_compensation,
                "inventory": inventory_svc.on_compensation,
            }
            consumer = PushConsumer(
                broker.grpc,
                group,
                {topic[COMPENSATIONS]: MessageSelector.all()},
                compensation_listener(lambda comp, message: handlers[comp.target_service](comp)),
            )
            await consumer.start()
            compensation_consumers.append(consumer)

        placed = orders_to_place(args.orders, args.seed)
        committed = [
            o
            for o in placed
            if await orders_svc.place(
                o["order_id"], "widget", o["qty"], o["amount"], fail_locally=o["fail_locally"]
            )
        ]
        print(
            f"placed {len(placed)} orders: {len(committed)} committed, "
            f"{len(placed) - len(committed)} rolled back with their messages"
        )

        consumers = [
            (
                SimpleConsumer(
                    broker.grpc,
                    f"{run_tag}-{ORDER_CREATED}-g",
                    {topic[ORDER_CREATED]: MessageSelector.all()},
                ),
                inventory_svc.on_order_created,
            ),
            (
                SimpleConsumer(
                    broker.grpc,
                    f"{run_tag}-{STOCK_RESERVED}-g",
                    {topic[STOCK_RESERVED]: MessageSelector.all()},
                ),
                payment_svc.on_stock_reserved,
            ),
            (
                SimpleConsumer(
                    broker.grpc,
                    f"{run_tag}-{PAYMENT_DONE}-g",
                    {topic[PAYMENT_DONE]: MessageSelector.all()},
                ),
                orders_svc.on_payment_done,
            ),
        ]
        for consumer, _ in consumers:
            await consumer.start()
        delivered = 0
        deadline = time.monotonic() + args.timeout
        try:
            while time.monotonic() < deadline and not settled(engine, schema):
                for consumer, handle in consumers:
                    # One message at a time on this loop: no two database transactions
                    # of the loop are open at once (SQLite has one writer).
                    for message in await consumer.receive(16, 30, wait=0.1):
                        delivered += 1
                        result = handle(message)
                        if asyncio.iscoroutine(result):
                            await result
                        if delivered % 4 == 0:
                            # Replay every 4th delivery, as a redelivery after a lost ack would.
                            result = handle(message)
                            if asyncio.iscoroutine(result):
                                await result
                        await consumer.ack(message)
        finally:
            for consumer, _ in consumers:
                await consumer.close()
            for consumer in compensation_consumers:
                await consumer.close()
            for p in (order_p, inventory_p, payment_p):
                await p.close()
            if rabbit_connection is not None:
                for queue in (rabbit or {}).values():
                    await queue.delete()
                await rabbit_connection.close()
        ok, lines = consistency_report(engine, schema, placed, STOCK, stats)
    print("\n".join(lines))
    if not args.keep and args.db:
        schema.metadata.drop_all(engine)
    engine.dispose()
    tmpdir.cleanup()
    return 0 if ok else 1


def settled(engine: Any, schema: Schema) -> bool:
    """Every order decided, and every cancelled order's reservation released."""
    from sqlalchemy import and_, func, select

    o, r = schema.orders, schema.reservations
    with engine.connect() as conn:
        pending = conn.execute(
            select(func.count()).select_from(o).where(o.c.status == "pending")
        ).scalar()
        held = conn.execute(
            select(func.count())
            .select_from(r.join(o, r.c.order_id == o.c.id))
            .where(and_(o.c.status == "cancelled", r.c.status == "reserved"))
        ).scalar()
    return pending == 0 and held == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The orders example: transactional messages, inbox, compensations, and a "
        "consistency report."
    )
    parser.add_argument("--db", help="SQLAlchemy URL (default: SQLite in a temporary directory)")
    parser.add_argument(
        "--amqp",
        help="send compensations through RabbitMQ retry queues at this URL instead of halfmoon "
        "topics",
    )
    parser.add_argument(
        "--broker", help="an existing halfmoon gRPC endpoint HOST:PORT (default: start one)"
    )
    parser.add_argument("--admin", help="its admin API http://HOST:PORT (with --broker)")
    parser.add_argument("--orders", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--timeout", type=float, default=90.0, help="seconds to wait for every order to settle"
    )
    parser.add_argument("--keep", action="store_true", help="keep the tables afterwards")
    args = parser.parse_args(argv)
    if bool(args.broker) != bool(args.admin):
        parser.error("--broker and --admin go together")
    logging.basicConfig(
        level=logging.DEBUG if os.environ.get("ORDERS_DEBUG") else logging.WARNING,
        format="%(levelname)s %(name)s %(message)s",
    )
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
