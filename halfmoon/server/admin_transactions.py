"""Admin endpoints over transactions: the undecided and the parked, and an operator's
decision of one transaction or of a transaction group."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from halfmoon.broker.transactions import DecisionSource, Resolution
from halfmoon.server.admin_http import ApiError, broker_of, call, reply
from halfmoon.server.admin_routes import RouteTable
from halfmoon.server.admin_schemas import INT, STR, name_in_path, path, query, ref

SCHEMAS: dict[str, Any] = {
    "Transaction": {
        "type": "object",
        "properties": {
            "transaction_id": {**STR, "description": "as SendMessage returned it"},
            "topic": {**STR, "description": "the real topic it is committed to"},
            "queue_id": INT,
            "message_id": STR,
            "keys": {"type": "array", "items": STR},
            "producer_group": {"type": "string", "nullable": True},
            "transaction_group": {
                "type": "string",
                "nullable": True,
                "description": "decided with its group, not alone",
            },
            "state": {"type": "string", "enum": ["prepared", "parked"]},
            "checks_sent": {**INT, "description": "checks a live producer received"},
            "age_ms": {**INT, "description": "since the half message was stored"},
            "stored_ms": INT,
            "next_check_ms": {
                **INT,
                "nullable": True,
                "description": "the check service's next scan that takes it (parks it at the "
                "check limit); null when none will: parked, or a transaction group's member",
            },
        },
    },
    "TransactionList": {
        "type": "object",
        "properties": {"transactions": {"type": "array", "items": ref("Transaction")}},
    },
    "TransactionDecision": {
        "type": "object",
        "properties": {
            "transaction_id": STR,
            "state": {"type": "string", "enum": ["committed", "rolled_back"]},
        },
    },
    "TransactionGroupDecision": {
        "type": "object",
        "properties": {
            "transaction_group": STR,
            "state": {"type": "string", "enum": ["committed", "rolled_back"]},
            "members_decided": {
                **INT,
                "description": "members decided by this call (0 when repeated)",
            },
        },
    },
}

routes = RouteTable(SCHEMAS)

TRANSACTION = path("transaction_id", "the transaction id SendMessage returned")
RESOLUTION = path("resolution", schema={"type": "string", "enum": ["commit", "rollback"]})
LIMIT = query("limit", "at most this many (default 1000)", {**INT, "minimum": 1})

TRANSACTION_LIMIT = 1000


def _limit(request: web.Request) -> int:
    text = request.query.get("limit")
    if text is None:
        return TRANSACTION_LIMIT
    try:
        value = int(text)
    except ValueError:
        raise ApiError(f"query parameter 'limit' must be an integer, not {text!r}") from None
    if value < 1:
        raise ApiError(f"query parameter 'limit' must be at least 1, not {value}")
    return value


@routes.route(
    "GET",
    "/v1/transactions",
    "Undecided transactions, oldest first",
    "listTransactions",
    (200, "TransactionList", "prepared and parked"),
    400,
    params=[query("topic", "only this topic's"), LIMIT],
)
async def list_transactions(request: web.Request) -> web.Response:
    topic = request.query.get("topic") or None
    found = await call(broker_of(request).list_transactions, topic, _limit(request))
    return reply({"transactions": found})


@routes.route(
    "GET",
    "/v1/transactions/parked",
    "Transactions parked after the check limit",
    "listParkedTransactions",
    (200, "TransactionList", "parked"),
    400,
    params=[LIMIT],
)
async def parked_transactions(request: web.Request) -> web.Response:
    return reply(
        {"transactions": await call(broker_of(request).parked_transactions, _limit(request))}
    )


@routes.route(
    "POST",
    "/v1/transactions/{transaction_id}/{resolution:commit|rollback}",
    "Commit or roll back a transaction as an operator (durable when answered)",
    "decideTransaction",
    (200, "TransactionDecision", "decided"),
    400,
    409,
    params=[TRANSACTION, RESOLUTION],
)
async def decide_transaction(request: web.Request) -> web.Response:
    """An operator's commit or rollback; answered once the decision is durable."""
    transaction_id = request.match_info["transaction_id"]
    resolution = Resolution(request.match_info["resolution"])  # the route admits two
    state = await call(
        broker_of(request).end_transaction,
        "",
        "",
        transaction_id,
        resolution,
        DecisionSource.OPERATOR,
    )
    return reply({"transaction_id": transaction_id, "state": state})


@routes.route(
    "POST",
    "/v1/transactions/{transaction_id}/resume",
    "Put a parked transaction back under checks (count reset)",
    "resumeTransaction",
    (200, "Transaction", "prepared again"),
    400,
    409,
    params=[TRANSACTION],
)
async def resume_transaction(request: web.Request) -> web.Response:
    info = await call(broker_of(request).resume_transaction, request.match_info["transaction_id"])
    return reply(info)


@routes.route(
    "POST",
    "/v1/transaction-groups/{group}/{resolution:commit|rollback}",
    "Commit or roll back every member of a transaction group",
    "decideTransactionGroup",
    (200, "TransactionGroupDecision", "decided"),
    400,
    409,
    params=[name_in_path("group", "Transaction group"), RESOLUTION],
)
async def decide_transaction_group(request: web.Request) -> web.Response:
    group = request.match_info["group"]
    resolution = Resolution(request.match_info["resolution"])  # the route admits two
    members = await call(
        broker_of(request).end_transaction_group, group, resolution, DecisionSource.OPERATOR
    )
    state = "committed" if resolution is Resolution.COMMIT else "rolled_back"
    return reply({"transaction_group": group, "state": state, "members_decided": members})
