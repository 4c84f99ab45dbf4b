"""The op topic: one small record per thing that happened to a half message.

Half messages live in ``RMQ_SYS_TRANS_HALF_TOPIC`` (queue 0) and are never
rewritten. What happens to them afterwards is appended to
``RMQ_SYS_TRANS_OP_HALF_TOPIC`` (queue 0) as an op record: an empty body and
a few properties::

    __HM_OP         rollback | checked | parked | resumed | group_commit | group_rollback
                    (commit: written by older versions and by nothing now, still understood)
    __HM_TXN_HALF   the half message's commit-log offset (every op but the group ones)
    __HM_TXN_GROUP  the transaction group (group ops)
    __HM_CHECKS     the check count after a ``checked`` / at a ``parked``
    __HM_SRC        who decided: client | check | operator
    KEYS            ``g<group>`` on group ops
    body            empty, but for a ``group_commit`` holding consume actions (acks,
                    rejects, offset commits: JSON, see :mod:`consume`)

A commit has no op record: the real message, appended to its real topic with
the half offset in ``prepared_transaction_offset``, is the commit record (one
record, so a crash cannot separate the decision from the message). Recovery
and old lookups find it through the key index by message id. The KEYS on
group ops let the key index find a group's decision long after it left the
service's memory. A group decision is a single ``group_*`` record: the commit
point of the whole group.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from halfmoon.broker.message import PROPERTY_TRANSACTION_GROUP
from halfmoon.store.message import PROPERTY_KEYS, Message, StoredMessage

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"  # parked half messages, as RocketMQ names it
QUEUE_ID = 0

PROPERTY_OP = "__HM_OP"
PROPERTY_HALF_OFFSET = "__HM_TXN_HALF"
PROPERTY_CHECKS = "__HM_CHECKS"
PROPERTY_SOURCE = "__HM_SRC"


class OpKind(enum.Enum):
    COMMIT = "commit"
    ROLLBACK = "rollback"
    CHECKED = "checked"
    PARKED = "parked"
    RESUMED = "resumed"
    GROUP_COMMIT = "group_commit"
    GROUP_ROLLBACK = "group_rollback"


@dataclass(frozen=True, slots=True)
class Op:
    kind: OpKind
    half_offset: int = -1
    group: str | None = None
    checks: int = 0
    source: str = ""


def group_key(group: str) -> str:
    return f"g{group}"


def op_message(op: Op, body: bytes = b"") -> Message:
    """The record of ``op``; a ``group_commit``'s ``body`` holds the group's consume actions
    (:mod:`consume`)."""
    props = {PROPERTY_OP: op.kind.value}
    if op.half_offset >= 0:
        props[PROPERTY_HALF_OFFSET] = str(op.half_offset)
    if op.group is not None:
        props[PROPERTY_TRANSACTION_GROUP] = op.group
    if op.kind in (OpKind.CHECKED, OpKind.PARKED):
        props[PROPERTY_CHECKS] = str(op.checks)
    if op.source:
        props[PROPERTY_SOURCE] = op.source
    if op.kind in (OpKind.GROUP_COMMIT, OpKind.GROUP_ROLLBACK):
        props[PROPERTY_KEYS] = group_key(op.group or "")
    return Message(topic=OP_TOPIC, body=body, queue_id=QUEUE_ID, properties=props)


def parse_op(stored: StoredMessage) -> Op | None:
    """The op a stored record holds; None for a record that is not one (logged by the caller)."""
    props = stored.properties
    try:
        kind = OpKind(props.get(PROPERTY_OP, ""))
        return Op(
            kind=kind,
            half_offset=int(props.get(PROPERTY_HALF_OFFSET, "-1")),
            group=props.get(PROPERTY_TRANSACTION_GROUP),
            checks=int(props.get(PROPERTY_CHECKS, "0")),
            source=props.get(PROPERTY_SOURCE, ""),
        )
    except ValueError:
        return None
