"""halfmoon's transactional-consumption headers on RocketMQ's own RPCs.

The official clients never send them, so for them every call keeps its
RocketMQ meaning. halfmoon's client (``halfmoon.client.consume_transaction``)
adds them to put an ack, a reject or an offset commit into a transaction
group (docs/transactions.md, "Transactional consumption"):

- ``x-hm-txn-group: <group id>`` on AckMessage, ChangeInvisibleDuration (a
  reject: redeliver after the given duration), ForwardMessageToDeadLetterQueue
  (a reject to the dead-letter topic) and UpdateOffset: register the action
  with the group instead of applying it now;
- ``x-hm-txn-retry-backoff: 1`` on such a ChangeInvisibleDuration: redeliver
  after the group's retry backoff for the attempt, not the given duration;
- ``x-hm-txn-expected-offset: <n>`` on such an UpdateOffset: the committed
  offset the consumer read from (-1: none); the commit is fenced if it moved;
- ``x-hm-txn-actions: <n>`` on the EndTransaction that commits ``hm-group:<id>``:
  how many actions the client registered (a broker that lost some refuses).
"""

from __future__ import annotations

import grpc

from halfmoon.server.errors import RequestError
from halfmoon.server.rpc_common import metadata

GROUP_HEADER = "x-hm-txn-group"
RETRY_BACKOFF_HEADER = "x-hm-txn-retry-backoff"
EXPECTED_OFFSET_HEADER = "x-hm-txn-expected-offset"
ACTIONS_HEADER = "x-hm-txn-actions"


def _integer(context: grpc.aio.ServicerContext, key: str) -> int | None:
    text = metadata(context, key)
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise RequestError(f"header {key} must be an integer, got {text!r}") from None


def transaction_group(context: grpc.aio.ServicerContext) -> str | None:
    """The transaction group a consume call joins; None: a plain call."""
    return metadata(context, GROUP_HEADER) or None


def wants_retry_backoff(context: grpc.aio.ServicerContext) -> bool:
    return metadata(context, RETRY_BACKOFF_HEADER) == "1"


def expected_offset(context: grpc.aio.ServicerContext) -> int:
    value = _integer(context, EXPECTED_OFFSET_HEADER)
    if value is None:
        raise RequestError(
            f"a transactional UpdateOffset needs {EXPECTED_OFFSET_HEADER}: the committed offset "
            "the consumer read from (-1: none)"
        )
    return value


def consume_actions(context: grpc.aio.ServicerContext) -> int | None:
    """How many consume actions the client registered with the group it commits (None: not
    said)."""
    return _integer(context, ACTIONS_HEADER)
