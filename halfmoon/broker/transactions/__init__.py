"""Transactional messages: half messages, decisions, checks, transaction groups.

See ``docs/transactions.md``. Modules: :mod:`ids` (transaction ids),
:mod:`oplog` (op records), :mod:`records` (half / real / parked records),
:mod:`service` (the service), :mod:`recovery` (restart), :mod:`check` (the
check service), :mod:`groups` (transaction groups), :mod:`config`.
"""

from halfmoon.broker.transactions.check import CheckSender, CheckService, ScanReport
from halfmoon.broker.transactions.config import TransactionConfig
from halfmoon.broker.transactions.errors import (
    IllegalTransactionGroup,
    InvalidTransactionId,
    TransactionAlreadyEnded,
    TransactionGroupEnded,
    TransactionGroupMember,
    TransactionStateError,
)
from halfmoon.broker.transactions.ids import (
    GROUP_ID_PREFIX,
    decode_transaction_id,
    encode_transaction_id,
    group_of_transaction_id,
)
from halfmoon.broker.transactions.oplog import CHECK_MAX_TOPIC, HALF_TOPIC, OP_TOPIC
from halfmoon.broker.transactions.resolutions import DecisionSource, Resolution
from halfmoon.broker.transactions.service import (
    EndRequest,
    EndResult,
    TransactionInfo,
    TransactionService,
    TransactionStats,
)

__all__ = [
    "CHECK_MAX_TOPIC",
    "GROUP_ID_PREFIX",
    "HALF_TOPIC",
    "OP_TOPIC",
    "CheckSender",
    "CheckService",
    "DecisionSource",
    "EndRequest",
    "EndResult",
    "IllegalTransactionGroup",
    "InvalidTransactionId",
    "Resolution",
    "ScanReport",
    "TransactionAlreadyEnded",
    "TransactionConfig",
    "TransactionGroupEnded",
    "TransactionGroupMember",
    "TransactionInfo",
    "TransactionService",
    "TransactionStateError",
    "TransactionStats",
    "decode_transaction_id",
    "encode_transaction_id",
    "group_of_transaction_id",
]
