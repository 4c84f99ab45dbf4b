"""Where pop consumers stand, written to the commit log so it moves with it (to replicas).

A broker keeps its pop state (:mod:`pop_state`) in ``consumption.json``, a
snapshot written every few seconds and not replicated. So that an answered
ack survives a crash (as durable as a send: ``halfmoon serve`` and
``halfmoon broker`` journal) and a broker group's new master neither loses
messages nor starts a group over, each queue's state is appended as a
record of the internal topic ``%HM_POP%``, a JSON body
``{"g": group, "t": topic, "q": queue id, "s": state}``. The state is the
queue's snapshot form (committed position, cursor, the offsets in flight
with their delivery attempts) while at most ``MAX_INFLIGHT_JOURNALED`` are in
flight, else only ``{"committed": position}`` (everything below it acked or
otherwise done), so a record stays small. A queue is recorded:

- when a group first touches it (its starting point: for a group that
  starts at the latest offset, the messages after it are the group's);
- on an offset reset;
- at each state snapshot (``offset_persist_interval_ms``, 5 s by default),
  when it changed since its last record;
- at least every ``FULL_EVERY_S`` (an hour), so retention, which deletes old
  records with their segment, always leaves one.

``{"drop": group}`` records a group forgotten. Each ack batch (the acked
offsets of one group and topic, per queue) is recorded as ``{"g": group,
"t": topic, "acks": [[queue id, [offset, ...]], ...]}``, and the ack answers
only once that record is durable as the store acknowledges writes (under a
sync-replicated broker group: once the in-sync replicas hold it), as offset
commits do. Each receive that delivered is recorded as ``{"g": group, "t":
topic, "entries": [[queue id, [entry, ...]], ...]}``, each entry a delivery's
snapshot form (a message passed by until its delivery time with it: a
transaction group member committed with one), as is a held delivery hidden
again or released (nothing waits
on these: written to the log before the receive answers, they survive a
killed process; a machine's crash can lose the unflushed tail under the
async flush policy). So a restart knows every delivery it made: those in
flight come back marked as delivered before (their attempt counts them),
and those held by a live holder stay hidden. State and entries records name
the issuer of their receipt handles (``"k"``, ``ReceiptCodec.issuer``): a
broker replaying another's records (a new master) cannot take those handles,
so it restores their held deliveries unheld, visible at once. The per-queue
state records stay the compaction points.

Each pop service has its journal in a queue of its own: the broker's in queue
``POP_QUEUE`` (0), the lite topics' (:mod:`lite`) in ``LITE_POP_QUEUE`` (1).

Records are appended under the (group, topic) state's lock, so their order is
the order the state changed in. Replayed when a broker opens (after its
snapshot's mark), a state record replaces the queue's state; an ack record
marks its offsets consumed (an offset past the recorded cursor is skipped when
it is reached); a queue with no record is a first contact as before. What
changed after a queue's last record and is neither an ack nor a delivery is
not in the log (an unheld delivery's change of invisible time, a cursor moved
past filtered messages): after a failover the new master delivers it again
(never loses it): unheld deliveries in flight at once, as after a restart. An
answered ack is not delivered again. An entries record applies its entries
(:meth:`~halfmoon.broker.consumption.QueueConsumption.restore`).
Receipt handles of the old master do not work on the new one (the receipt
key is the broker's own).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from halfmoon.broker.topics import POP_TOPIC
from halfmoon.store.api import AppendResult, GetStatus, Store
from halfmoon.store.message import Message

FULL_EVERY_S = 3600.0
WAIT_TIMEOUT_S = 30.0
MAX_INFLIGHT_JOURNALED = 1024  # more in flight: only the committed position is recorded
_REPLAY_BATCH = 256
POP_QUEUE = 0  # the broker's pop service
LITE_POP_QUEUE = 1  # the lite topics' pop service

QueueKey = tuple[str, str, int]  # (group, topic, queue id)


class PopJournal:
    def __init__(self, store: Store, queue_id: int = POP_QUEUE) -> None:
        self.store = store
        self.queue_id = queue_id
        # Who issued the receipt handles of what the records hold in flight (the broker's
        # receipt key, named: ``ReceiptCodec.issuer``), set by the state table it journals.
        self.issuer = ""
        # Past the last record appended here: the store's consume queue may show a record
        # a moment after its append returned.
        self._appended_end = 0

    def record(self, states: Iterable[tuple[QueueKey, dict[str, Any]]]) -> None:
        """Append the state of each queue (one append; nothing waits on it: an
        unreplicated record only means more is delivered again)."""
        messages = [
            self._message({"g": g, "t": t, "q": q, "s": s, "k": self.issuer})
            for (g, t, q), s in states
        ]
        if messages:
            self._appended(self.store.append(messages))

    def record_acks(self, group: str, topic: str, acks: dict[int, list[int]]) -> int:
        """Append one ack batch (queue id -> acked offsets); the end offset to :meth:`wait` for."""
        body = {"g": group, "t": topic, "acks": [[q, offsets] for q, offsets in acks.items()]}
        results = self.store.append([self._message(body)])
        self._appended(results)
        return results[-1].end_offset

    def record_entries(self, group: str, topic: str, entries: dict[int, list[list[Any]]]) -> None:
        """Append the deliveries of one receive (queue id -> entries in their snapshot form),
        or held entries changed; nothing waits on it."""
        body = {
            "g": group,
            "t": topic,
            "entries": [[q, e] for q, e in entries.items()],
            "k": self.issuer,
        }
        self._appended(self.store.append([self._message(body)]))

    def wait(self, end_offset: int) -> None:
        """Until the record is acknowledged as the store acknowledges writes (raising what
        the acknowledgement raised, e.g. NOT_ENOUGH_REPLICAS)."""
        self.durable(end_offset).result(WAIT_TIMEOUT_S)

    def durable(self, end_offset: int) -> Future[None]:
        """Completes when :meth:`wait` would return (an event loop awaits it)."""
        return self.store.durable(end_offset)

    def record_drop(self, group: str) -> None:
        self._appended(self.store.append([self._message({"drop": group})]))

    def _appended(self, results: list[AppendResult]) -> None:
        self._appended_end = max(self._appended_end, results[-1].queue_offset + 1)

    @property
    def end(self) -> int:
        """The queue offset the next record will have."""
        return max(self._appended_end, self.store.max_offset(POP_TOPIC, self.queue_id))

    def replay(
        self,
        start: int,
        apply_set: Callable[[QueueKey, dict[str, Any], str], None],
        apply_drop: Callable[[str], None],
        apply_acks: Callable[[QueueKey, list[int]], None],
        apply_entries: Callable[[QueueKey, list[list[Any]], str], None],
    ) -> int:
        """Apply the records from queue offset ``start`` on, in order; where the journal ends.
        State and entries records are applied with the issuer they name ("" for none)."""
        offset = max(start, self.store.min_offset(POP_TOPIC, self.queue_id))
        while True:
            got = self.store.get(POP_TOPIC, self.queue_id, offset, _REPLAY_BATCH)
            if got.status is not GetStatus.FOUND:
                return offset
            for stored in got.messages:
                try:
                    body = json.loads(stored.body)
                    if "drop" in body:
                        apply_drop(str(body["drop"]))
                    elif "acks" in body:
                        group, topic = str(body["g"]), str(body["t"])
                        for queue_id, offsets in body["acks"]:
                            acked = [int(offset) for offset in offsets]
                            apply_acks((group, topic, int(queue_id)), acked)
                    elif "entries" in body:
                        group, topic = str(body["g"]), str(body["t"])
                        for queue_id, entries in body["entries"]:
                            apply_entries(
                                (group, topic, int(queue_id)), list(entries), str(body.get("k", ""))
                            )
                    else:
                        state = dict(body["s"])
                        int(state["committed"])  # a record without it is not one of ours
                        key = (str(body["g"]), str(body["t"]), int(body["q"]))
                        apply_set(key, state, str(body.get("k", "")))
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # not written by this module: skip it
            offset = got.next_offset

    def _message(self, body: dict[str, Any]) -> Message:
        return Message(topic=POP_TOPIC, body=json.dumps(body).encode(), queue_id=self.queue_id)
