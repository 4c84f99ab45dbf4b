"""The saga helper: forward, reverse compensation on failure, each step and compensation once."""

from __future__ import annotations

import pytest
from sqlalchemy import Column, Engine, Integer, String, Table, insert, select, update

from halfmoon.outbox.inbox import Inbox
from halfmoon.outbox.saga import COMPENSATED, COMPLETED, Saga, SagaCompensationFailed
from tests.outbox import toolkit_support

engine, prefix = toolkit_support.engine, toolkit_support.prefix


class World:
    """Stock, payments and shipments tables, and a saga over them that records every call."""

    def __init__(self, engine: Engine, prefix: str) -> None:
        self.engine = engine
        self.inbox = Inbox("order-saga", table_prefix=prefix)
        md = self.inbox.metadata
        self.stock = Table(
            f"{prefix}stock",
            md,
            Column("sku", String(16), primary_key=True),
            Column("qty", Integer, nullable=False),
        )
        self.effects = Table(
            f"{prefix}effects",
            md,
            Column("id", String(64), primary_key=True),
            Column("kind", String(16), nullable=False),
        )
        md.create_all(engine)
        with engine.begin() as conn:
            conn.execute(insert(self.stock).values(sku="apple", qty=10))
        self.calls: list[str] = []
        self.fail_compensation = False
        self.saga = Saga("order", engine, self.inbox)
        s = self.saga

        @s.step("reserve", compensation=self.release)
        def reserve(conn, ctx):
            self.calls.append("reserve")
            conn.execute(update(self.stock).values(qty=self.stock.c.qty - ctx["qty"]))

        @s.step("charge", compensation=self.refund)
        def charge(conn, ctx):
            self.calls.append("charge")
            conn.execute(insert(self.effects).values(id=f"pay-{ctx['order']}", kind="payment"))

        @s.step("ship")
        def ship(conn, ctx):
            self.calls.append("ship")
            conn.execute(insert(self.effects).values(id=f"ship-{ctx['order']}", kind="shipment"))
            if ctx.get("ship_fails"):
                raise RuntimeError(
                    "no courier"
                )  # after a write: the step's own write is rolled back

    def release(self, conn, ctx):
        self.calls.append("release")
        conn.execute(update(self.stock).values(qty=self.stock.c.qty + ctx["qty"]))

    def refund(self, conn, ctx):
        self.calls.append("refund")
        if self.fail_compensation:
            raise RuntimeError("payment provider down")
        conn.execute(insert(self.effects).values(id=f"refund-{ctx['order']}", kind="refund"))

    def state(self) -> tuple[int, list[str]]:
        with self.engine.connect() as conn:
            qty = conn.execute(select(self.stock.c.qty)).scalar_one()
            kinds = sorted(conn.execute(select(self.effects.c.kind)).scalars().all())
        return qty, kinds


@pytest.fixture
def world(engine: Engine, prefix: str):
    w = World(engine, prefix)
    yield w
    w.inbox.metadata.drop_all(engine)


def test_completed_saga_runs_each_step_once(world: World) -> None:
    result = world.saga.run("o1", {"order": "o1", "qty": 3})
    assert (result.status, result.completed, result.compensated) == (
        COMPLETED,
        ["reserve", "charge", "ship"],
        [],
    )
    again = world.saga.run("o1", {"order": "o1", "qty": 3})  # a redelivered command
    assert again.status == COMPLETED
    assert world.calls == ["reserve", "charge", "ship"]
    assert world.state() == (7, ["payment", "shipment"])


def test_failure_compensates_in_reverse_and_stays_compensated(world: World) -> None:
    ctx = {"order": "o2", "qty": 4, "ship_fails": True}
    result = world.saga.run("o2", ctx)
    assert result.status == COMPENSATED and result.failed_step == "ship"
    assert isinstance(result.error, RuntimeError)
    assert result.compensated == ["charge", "reserve"]
    assert world.calls == ["reserve", "charge", "ship", "refund", "release"]
    assert world.state() == (
        10,
        ["payment", "refund"],
    )  # no shipment row: the failed step rolled back
    # Run again, even with the cause gone: an aborted saga does not go forward again.
    again = world.saga.run("o2", {"order": "o2", "qty": 4})
    assert again.status == COMPENSATED and again.compensated == ["charge", "reserve"]
    assert world.calls == ["reserve", "charge", "ship", "refund", "release"]
    assert world.state() == (10, ["payment", "refund"])


def test_failed_compensation_resumes_on_the_next_run(world: World) -> None:
    world.fail_compensation = True
    ctx = {"order": "o3", "qty": 2, "ship_fails": True}
    with pytest.raises(SagaCompensationFailed, match="refund|charge") as info:
        world.saga.run("o3", ctx)
    assert info.value.code == "SAGA_COMPENSATION_FAILED"
    assert world.state() == (8, ["payment"])  # stock still reserved: release comes after refund
    world.fail_compensation = False
    result = world.saga.run("o3", ctx)
    assert result.status == COMPENSATED and result.compensated == ["charge", "reserve"]
    assert world.state() == (10, ["payment", "refund"])
    assert world.calls.count("release") == 1


def test_step_names_are_unique(engine: Engine, prefix: str) -> None:
    saga = Saga("s", engine, Inbox("s", table_prefix=prefix))
    saga.step("a")(lambda conn, ctx: None)
    with pytest.raises(ValueError, match="already has a step"):
        saga.step("a")(lambda conn, ctx: None)
