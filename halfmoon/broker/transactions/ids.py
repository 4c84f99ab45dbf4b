"""Transaction ids: the half message's commit-log offset, with a checksum.

A transaction id names its half message by position, so EndTransaction works
from any connection and after a restart with no session state (RocketMQ's
proxy loses commits that reach a restarted proxy: its issue 9431). Format:
``T`` + 16 hex digits of the offset + 8 hex digits of a CRC32 over a fixed
salt and the offset. A garbled or forged id fails the checksum and is a clean
``INVALID_TRANSACTION_ID``; a well-formed id whose offset holds no half
message is caught by the service when it looks the offset up.

Transaction groups are ended with ``hm-group:<group id>`` in the
EndTransaction's transaction id field (see ``docs/transactions.md``).
"""

from __future__ import annotations

import zlib

from halfmoon.broker.transactions.errors import InvalidTransactionId

_PREFIX = "T"
_SALT = b"halfmoon-transaction-id/1:"
_LENGTH = 1 + 16 + 8
GROUP_ID_PREFIX = "hm-group:"


_SALT_CRC = zlib.crc32(_SALT)  # crc32 of salt + offset continues from the salt's


def _checksum(offset: int) -> int:
    return zlib.crc32(offset.to_bytes(8, "big"), _SALT_CRC) & 0xFFFFFFFF


def encode_transaction_id(half_offset: int) -> str:
    """The id a producer gets back for the half message stored at ``half_offset``."""
    return f"{_PREFIX}{half_offset:016X}{_checksum(half_offset):08X}"


def decode_transaction_id(transaction_id: str) -> int:
    """The half message's commit-log offset; InvalidTransactionId for anything else."""
    text = transaction_id.strip() if isinstance(transaction_id, str) else ""
    if len(text) == _LENGTH and text[0] == _PREFIX:
        try:
            offset = int(text[1:17], 16)
            checksum = int(text[17:], 16)
        except ValueError:
            pass
        else:
            if checksum == _checksum(offset):
                return offset
    raise InvalidTransactionId(
        f"{transaction_id!r} is not a transaction id issued by this broker; "
        "use the transaction id from the send result of the half message"
    )


def group_of_transaction_id(transaction_id: str) -> str | None:
    """The group id when ``transaction_id`` names a transaction group (``hm-group:<id>``)."""
    if isinstance(transaction_id, str) and transaction_id.startswith(GROUP_ID_PREFIX):
        return transaction_id[len(GROUP_ID_PREFIX) :]
    return None
