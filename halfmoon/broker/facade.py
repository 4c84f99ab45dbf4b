"""The ``Broker`` facade: every operation the front ends (gRPC servicer, admin API) call.

The front ends talk to this protocol and to nothing below it (no store, no
registries), the way nsqd's ``http.go`` and ``protocol_v2.go`` both end in
``topic.PutMessage``. Today one class implements it, the in-process
:class:`halfmoon.broker.broker.Broker`; a proxy driving a broker in another
process implements the same protocol (``tests/broker/test_facade_contract.py``
is the contract both must pass). Each operation is documented once, in its
role, as RocketMQ's proxy splits its ``ServiceManager``: administration
(:mod:`facade_admin`: settings, status, topics, groups), messaging
(:mod:`facade_messages`: send, pop, pull, lite topics), transactions
(:mod:`facade_transactions`) and browsing (:mod:`facade_browse`: stored
messages for operators); ``Broker`` is all four, and what derives itself from
the facade (the internal protocol's service, the contract test) walks them
with :func:`operations`.

Calling conventions:

- Operations are synchronous and may wait for the disk (or, remote, the
  network): a front end on an event loop runs them on a worker thread.
- The exceptions are the ``*_nowait`` calls. A ``*_nowait`` call returns a
  :class:`Written`: its result, and a future that completes when the
  operation's promise holds (durable under the flush policy), to be awaited
  without holding a thread. The plain form of the same call waits for it.
  None of them blocks: the sends (``send_nowait``, ``send_fanout_nowait``), the
  ends of transactions (``end_transaction_nowait``, ``end_transactions_nowait``,
  ``end_transaction_group_nowait``), the receive and the ack of the pop path
  (``receive_nowait``, ``ack_nowait``). What would block (a topic to create,
  an index lookup, a group's state busy with another call, a network hop) the
  implementation defers into a :class:`Pending` answer, so a front end calls
  them on its event loop and uses a :class:`Written` answer there, or writes
  a :class:`Pending` one on a worker thread: one path whatever the broker.
- Errors are :class:`halfmoon.errors.HalfmoonError` subclasses with stable
  codes; each front end maps them to its own wire format.
- A broker a network hop away may also be :class:`WatchesArrivals`: it sends
  arrival wake-ups only for the topics the front end's long polls wait on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from halfmoon.broker.facade_admin import Administration
from halfmoon.broker.facade_browse import Browsing
from halfmoon.broker.facade_messages import Messaging
from halfmoon.broker.facade_transactions import Transactions
from halfmoon.broker.facade_types import (
    ALREADY_DURABLE,
    Answer,
    Pending,
    PullResult,
    QueueProgress,
    QueueRoute,
    QueueStatus,
    Written,
)
from halfmoon.broker.filter_spec import FilterSpec
from halfmoon.broker.message import MessageView, Received
from halfmoon.broker.transactions import (
    EndRequest,
    EndResult,
)
from halfmoon.errors import HalfmoonError

__all__ = [
    "Administration",
    "Answer",
    "Broker",
    "Browsing",
    "Messaging",
    "Pending",
    "PullResult",
    "QueueProgress",
    "QueueRoute",
    "QueueStatus",
    "Transactions",
    "WatchesArrivals",
    "Written",
    "acked_each",
    "end_each",
    "operations",
    "received_by_calls",
]


@runtime_checkable
class WatchesArrivals(Protocol):
    """A broker that calls an arrival listener only for the topics it is told to watch."""

    def add_watched_arrival_listener(self, callback: Callable[[str, int], None]) -> None:
        """As ``add_arrival_listener``, for watched topics only; watching a topic also calls
        it once for that topic (something may have arrived before the watch took effect)."""
        ...

    def watch_arrivals(self, topics: Sequence[str]) -> None:
        """Watch ``topics`` from now on (any thread; never blocks)."""
        ...

    def unwatch_arrivals(self, topics: Sequence[str]) -> None:
        """Stop watching ``topics`` (any thread; never blocks)."""
        ...


class Broker(Administration, Messaging, Transactions, Browsing, Protocol):
    """What a front end may ask of a broker (see the module docstring for conventions): every
    role's operations. A front end that needs one role types against that role."""


def operations(protocol: type = Broker) -> dict[str, Any]:
    """The operations ``protocol`` declares, its roles' included: name to declaration (a
    function or a property), for what derives itself from the facade."""
    found: dict[str, Any] = {}
    for cls in reversed(protocol.__mro__):
        if getattr(cls, "_is_protocol", False) and cls is not Protocol:
            found.update((n, v) for n, v in vars(cls).items() if not n.startswith("_"))
    return found


def end_each(
    broker: Broker, requests: Sequence[EndRequest]
) -> list[Answer[EndResult] | HalfmoonError]:
    """:meth:`Broker.end_transactions_nowait` for brokers that cannot batch decisions (one a
    network hop away): one :meth:`Broker.end_transaction_nowait` answer per request, each
    error in its place."""
    answers: list[Answer[EndResult] | HalfmoonError] = []
    for r in requests:
        try:
            answers.append(
                broker.end_transaction_nowait(
                    r.topic, r.message_id, r.transaction_id, r.resolution, r.source
                )
            )
        except HalfmoonError as exc:
            answers.append(exc)
    return answers


class Pops(Protocol):
    """What the plain forms of the pop path's event-loop calls need (a facade has it)."""

    def receive(
        self,
        group: str,
        topic: str,
        filter: FilterSpec,
        batch_size: int,
        invisible_ms: int,
        client_id: str = "",
        queue_id: int | None = None,
        holder: str = "",
    ) -> list[MessageView]: ...

    def next_wakeup_ms(self, group: str, topic: str, client_id: str = "") -> int | None: ...

    def ack(
        self, group: str, topic: str, receipt_handle: str, lite_topic: str | None = None
    ) -> None: ...


def received_by_calls(
    broker: Pops,
    group: str,
    topic: str,
    filter: FilterSpec,
    batch_size: int,
    invisible_ms: int,
    client_id: str = "",
    queue_id: int | None = None,
    holder: str = "",
) -> Written[Received]:
    """The write of a :meth:`Broker.receive_nowait` answer left :class:`Pending`: the plain
    :meth:`Broker.receive` and, when it found nothing, :meth:`Broker.next_wakeup_ms` (so a
    long poll knows how long it may park). Blocks: a worker thread calls it."""
    views = broker.receive(
        group, topic, filter, batch_size, invisible_ms, client_id, queue_id=queue_id,
        holder=holder,
    )  # fmt: skip
    wakeup = None if views else broker.next_wakeup_ms(group, topic, client_id)
    return Written(Received(views, wakeup), ALREADY_DURABLE)


def acked_each(
    broker: Pops, group: str, topic: str, receipt_handles: Sequence[str]
) -> Written[list[Exception | None]]:
    """The write of an :meth:`Broker.ack_nowait` answer left :class:`Pending`: the plain
    :meth:`Broker.ack` per handle, each handle's error in its place (durable when each
    returned). Blocks: a worker thread calls it."""
    results: list[Exception | None] = []
    for handle in receipt_handles:
        try:
            broker.ack(group, topic, handle)
        except Exception as error:  # noqa: BLE001 - one bad handle does not fail the others
            results.append(error)
        else:
            results.append(None)
    return Written(results, ALREADY_DURABLE)
