"""Epoch fencing of a proxy's requests to a member of a broker group.

A proxy knows each broker group's epoch from the group's routing entry in
etcd (``brokers/<group>``: the master's endpoint and ``epoch``) and opens one
connection per (endpoint, epoch): every request on it carries that epoch,
in the :data:`EPOCH_HEADER` metadata of each gRPC call (``Call``, ``Send``,
``SendStream``) and in the hello of the send listener's connection
(``{"epoch": N}``). The broker checks it against its own at every request,
before doing anything (:func:`epoch_refusal`):

- the epoch is the master's own and the master is not deposed: served;
- older than the master's: the proxy's route is stale (``EPOCH_STALE``);
- newer than the master's, or the master knows it was deposed: this broker
  is not the group's master any more (``MASTER_DEPOSED``).

Both codes are ``HA_NOT_AVAILABLE`` to RocketMQ clients, which retry. A
broker's calls to another for a transaction group carry the epoch etcd names
for it too (``txn_groups``). A request without an epoch (tools talking to a
broker directly) is not checked, and a broker outside a group checks nothing.
"""

from __future__ import annotations

from typing import Any

from halfmoon.cluster.errors import EpochStale, MasterDeposed
from halfmoon.cluster.internal.wire import MalformedRequest
from halfmoon.errors import HalfmoonError

EPOCH_HEADER = "hm-epoch"  # gRPC metadata: the group epoch the request is meant for


def header_value(epoch: int) -> str:
    return str(epoch)


def parse_epoch(raw: object) -> int | None:
    """The epoch a request names: an int, or the decimal text of the header; None when it
    names none; MalformedRequest for anything else."""
    if raw is None:
        return None
    if type(raw) is int and raw > 0:
        return raw
    if isinstance(raw, str) and raw.isascii() and raw.isdigit() and int(raw) > 0:
        return int(raw)
    raise MalformedRequest(f"an epoch is a positive integer, not {str(raw)[:32]!r}")


def epoch_refusal(
    sent: int, current: int | None, *, deposed: bool, group: str, member: str
) -> HalfmoonError | None:
    """Why a master in epoch ``current`` (None: not master) refuses a request meant for
    epoch ``sent``; None when it serves it."""
    if current is None or deposed or sent > current:
        known = "" if current is None else f" (epoch {current})"
        return MasterDeposed(
            f"broker {member}{known} is no longer the master of group {group}; the request "
            f"was meant for epoch {sent}: retry, the group's master has changed"
        )
    if sent < current:
        return EpochStale(
            f"the request was meant for epoch {sent} of group {group}, whose master {member} "
            f"is in epoch {current}: retry, the proxy's route to the group is refreshed"
        )
    return None


def group_epoch(record: dict[str, Any]) -> int | None:
    """The epoch a routing entry names for a broker group's master (None: a standalone
    broker, or an entry without one)."""
    epoch = record.get("epoch")
    if not record.get("member") or type(epoch) is not int or epoch <= 0:
        return None
    return epoch
