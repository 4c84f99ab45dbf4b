"""The three shapes of a transactional message in the store, and what is known of a pending one.

1. the *half* record in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0: the producer's
   message with its real topic and queue in ``REAL_TOPIC`` / ``REAL_QID``,
   ``TRAN_MSG=true``, sys flag ``TRANSACTION_PREPARED``, the producer group,
   the (capped) check immunity in seconds and a placeholder for the
   transaction id (its offset is not known before the append);
2. the *real* record appended on commit to the real topic and queue: the same
   message id, body and user properties, sys flag ``TRANSACTION_COMMITTED``,
   the half record's offset in ``prepared_transaction_offset`` (the
   back-reference recovery uses to tell a landed commit from a torn one) and
   the transaction id in ``__transactionId__``, which consumers see as a user
   property (RocketMQ's broker copies it from the half record);
3. the *parked* copy in ``TRANS_CHECK_MAX_TIME_TOPIC`` once checks ran out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from halfmoon.broker.message import (
    PROPERTY_CHECK_IMMUNITY,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_GROUP,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_TIMEOUT,
    MessageView,
)
from halfmoon.broker.transaction_state import TxnState
from halfmoon.broker.transactions.ids import encode_transaction_id
from halfmoon.broker.transactions.oplog import CHECK_MAX_TOPIC, HALF_TOPIC, QUEUE_ID
from halfmoon.store.message import Message, StoredMessage, SysFlag

# Plain ints: an IntFlag in a record's fields makes every store append slower.
_MASK = int(SysFlag.TRANSACTION_MASK)
_PREPARED = int(SysFlag.TRANSACTION_PREPARED)
_COMMITTED = int(SysFlag.TRANSACTION_COMMITTED)
# Holds the transaction id's room in the half record, so the real record is never the
# larger one: a half that fits the store's properties limit always commits.
_ID_PLACEHOLDER = "-" * len(encode_transaction_id(0))
_ROUTING = (
    PROPERTY_REAL_TOPIC,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_CHECK_IMMUNITY,
)


@dataclass(slots=True)
class PendingTxn:
    """A half message without a decision (PREPARED or PARKED): all the service keeps in memory."""

    half_offset: int
    half_end: int  # commit-log offset just past the half record
    topic: str
    queue_id: int
    message_id: str
    keys: tuple[str, ...]
    producer_group: str | None
    group: str | None
    stored_ms: int
    due_ms: int  # when it is first checked: stored + immunity, else stored + timeout
    checks: int = 0
    state: TxnState = TxnState.PREPARED
    last_check_ms: int | None = None
    # The half record as appended while young, or as read for its last check while the check
    # is answered: a commit then needs no read (see the service and :mod:`check_state`).
    record: Message | StoredMessage | None = None
    # Its place in the check service's due index (None: not indexed); see :mod:`due_index`.
    check_token: int | None = None
    # A group member: when its group, undecided, is rolled back (stored + the group's timeout).
    deadline_ms: int | None = None
    # Encoded once: checks, traces and pacing ask for it several times per check.
    transaction_id: str = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.transaction_id = encode_transaction_id(self.half_offset)


def make_half(
    record: Message, real_topic: str, real_queue_id: int, immunity_s: int | None
) -> Message:
    """Turn a planned record for ``real_topic`` into its half record (in place; returned)."""
    props = record.properties
    props[PROPERTY_REAL_TOPIC] = real_topic
    props[PROPERTY_REAL_QUEUE_ID] = str(real_queue_id)
    props[PROPERTY_TRANSACTION_PREPARED] = "true"
    props[PROPERTY_TRANSACTION_ID] = _ID_PLACEHOLDER
    if immunity_s is not None and immunity_s > 0:
        props[PROPERTY_CHECK_IMMUNITY] = str(immunity_s)
    else:
        props.pop(PROPERTY_CHECK_IMMUNITY, None)
    record.topic = HALF_TOPIC
    record.queue_id = QUEUE_ID
    record.sys_flag = _PREPARED | (record.sys_flag & ~_MASK)
    return record


def immunity_ms_of(properties: dict[str, str]) -> int:
    try:
        return max(0, int(properties.get(PROPERTY_CHECK_IMMUNITY, "0")) * 1000)
    except ValueError:
        return 0


def group_timeout_ms_of(properties: dict[str, str], default_ms: int) -> int:
    """The transaction timeout a group member's producer asked for (its property), else
    ``default_ms``: the durable half of a group's deadline (its start is the store time)."""
    try:
        asked = int(properties.get(PROPERTY_TRANSACTION_TIMEOUT, ""))
    except ValueError:
        return default_ms
    return asked if asked > 0 else default_ms


def pending_from_half(
    half: StoredMessage, stored_ms: int, timeout_ms: int, group_timeout_ms: int = 60_000
) -> PendingTxn | None:
    """What to keep of a stored half record; None when it is not one (logged by the caller)."""
    props = half.properties
    topic = props.get(PROPERTY_REAL_TOPIC)
    try:
        queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, ""))
    except ValueError:
        return None
    if not topic:
        return None
    immunity = immunity_ms_of(props)
    group = props.get(PROPERTY_TRANSACTION_GROUP)
    return PendingTxn(
        half_offset=half.commit_log_offset,
        half_end=half.commit_log_offset + half.size,
        topic=topic,
        queue_id=queue_id,
        message_id=half.unique_id or "",
        keys=tuple(half.keys),
        producer_group=props.get(PROPERTY_PRODUCER_GROUP),
        group=group,
        stored_ms=stored_ms,
        due_ms=stored_ms + (immunity if immunity > 0 else timeout_ms),
        deadline_ms=stored_ms + group_timeout_ms_of(props, group_timeout_ms)
        if group is not None
        else None,
    )


def real_from_half(
    half: StoredMessage | Message, half_offset: int, transaction_id: str | None = None
) -> Message:
    """The committed message: the half record (stored at ``half_offset``) back in its real queue.

    ``transaction_id``: the half's, when the caller has it encoded already (a pending entry).
    """
    props = dict(half.properties)
    topic = props.get(PROPERTY_REAL_TOPIC, "")
    queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, "0"))
    for name in _ROUTING:
        props.pop(name, None)
    props[PROPERTY_TRANSACTION_ID] = transaction_id or encode_transaction_id(half_offset)
    return Message(
        topic=topic,
        body=half.body,
        queue_id=queue_id,
        properties=props,
        flags=half.flags,
        sys_flag=_COMMITTED | (half.sys_flag & ~_MASK),
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        prepared_transaction_offset=half_offset,
    )


def parked_from_half(half: StoredMessage) -> Message:
    """The copy kept in the check-max topic (routing properties kept: it is a record of the
    half)."""
    return Message(
        topic=CHECK_MAX_TOPIC,
        body=half.body,
        queue_id=QUEUE_ID,
        properties=dict(half.properties),
        flags=half.flags,
        sys_flag=half.sys_flag,
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        prepared_transaction_offset=half.commit_log_offset,
    )


def check_view(half: StoredMessage, entry: PendingTxn) -> MessageView:
    """The message a producer's checker is shown: the half as it will look in its real queue."""
    view = MessageView.of(half)  # a fresh view: set in place (``dataclasses.replace`` is slow)
    view.topic = entry.topic
    view.queue_id = entry.queue_id
    view.transaction_id = entry.transaction_id
    return view
