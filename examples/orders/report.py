"""The consistency report: orders vs messages vs effects, each check a line marked ok or FAIL."""

from __future__ import annotations

from typing import Any

from services import Schema, Stats
from sqlalchemy import Engine, select


def consistency_report(
    engine: Engine, s: Schema, placed: list[dict[str, Any]], initial_stock: int, stats: Stats
) -> tuple[bool, list[str]]:
    with engine.connect() as conn:
        orders = {r.id: r for r in conn.execute(select(s.orders)).all()}
        reservations = {r.order_id: r for r in conn.execute(select(s.reservations)).all()}
        payments = {r.order_id: r for r in conn.execute(select(s.payments)).all()}
        stock = conn.execute(select(s.stock.c.qty)).scalar_one()
        order_messages = conn.execute(select(s.order_log.table.c.message_keys)).scalars().all()
    rolled_back = {o["order_id"] for o in placed if o["fail_locally"]}
    confirmed = {k for k, r in orders.items() if r.status == "confirmed"}
    cancelled = {k for k, r in orders.items() if r.status == "cancelled"}
    pending = {k for k, r in orders.items() if r.status == "pending"}
    held = {k for k, r in reservations.items() if r.status == "reserved"}
    checks = [
        (
            "every committed order has exactly one order-created message",
            sorted(order_messages) == sorted(orders),
        ),
        (
            "no row, message or effect for an order whose transaction rolled back",
            not (
                rolled_back & (set(orders) | stats.seen_orders | set(reservations) | set(payments))
            ),
        ),
        ("every committed order is confirmed or cancelled", not pending),
        (
            "every confirmed order holds its stock and was paid once",
            confirmed <= held and confirmed <= set(payments),
        ),
        (
            "no cancelled order holds stock or was paid",
            not (cancelled & held) and not (cancelled & set(payments)),
        ),
        (
            "stock = initial - confirmed quantities",
            stock == initial_stock - sum(orders[k].qty for k in confirmed),
        ),
        (
            "replayed deliveries had no second effect",
            sum(stats.duplicates.values()) > 0
            and len(payments) == len(set(payments))
            and len(reservations) == len(set(reservations)),
        ),
    ]
    ok = all(passed for _, passed in checks)
    lines = [
        "",
        "consistency report",
        "------------------",
        f"orders placed {len(placed)}: committed {len(orders)} (confirmed {len(confirmed)}, "
        f"cancelled {len(cancelled)}, pending {len(pending)}), rolled back {len(rolled_back)}",
        f"messages: {len(order_messages)} order-created logged; deliveries "
        f"{sum(stats.deliveries.values())}, duplicates absorbed by the inbox "
        f"{sum(stats.duplicates.values())}, stale compensations skipped {stats.stale}",
        f"effects: stock {stock}/{initial_stock}, reservations held {len(held)}, released "
        f"{len(reservations) - len(held)}, payments {len(payments)}",
        *(f"  {'ok  ' if passed else 'FAIL'} {text}" for text, passed in checks),
        "CONSISTENT" if ok else "INCONSISTENT",
    ]
    return ok, lines
