"""Where pop consumers stand, written to the commit log so it moves with it (to replicas).

A broker group's master keeps its pop state (:mod:`pop_state`) in
``consumption.json``, which is not replicated. So that a new master neither
loses messages nor starts a group over, each queue's state is appended as a
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
commits do. The per-queue state records stay the compaction points.

Each pop service has its journal in a queue of its own: the broker's in queue
``POP_QUEUE`` (0), the lite topics' (:mod:`lite`) in ``LITE_POP_QUEUE`` (1).

Records are appended under the (group, topic) state's lock, so their order is
the order the state changed in. Replayed when a broker opens (after its
snapshot's mark), a state record replaces the queue's state; an ack record
marks its offsets consumed (an offset past the recorded cursor is skipped when
it is reached); a queue with no record is a first contact as before. What
changed after a queue's last record and is not an ack is not in the log:
after a failover the new master delivers it again (never loses it):
deliveries in flight at once, as after a restart. An answered ack is not
delivered again.
Receipt handles of the old master do not work on the new one (the receipt
key is the broker's own).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
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
        # Past the last record appended here: the store's consume queue may show a record
        # a moment after its append returned.
        self._appended_end = 0

    def record(self, states: Iterable[tuple[QueueKey, dict[str, Any]]]) -> None:
        """Append the state of each queue (one append; nothing waits on it: an
        unreplicated record only means more is delivered again)."""
        messages = [self._message({"g": g, "t": t, "q": q, "s": s}) for (g, t, q), s in states]
        if messages:
            self._appended(self.store.append(messages))

    def record_acks(self, group: str, topic: str, acks: dict[int, list[int]]) -> int:
        """Append one ack batch (queue id -> acked offsets); the end offset to :meth:`wait` for."""
        body = {"g": group, "t": topic, "acks": [[q, offsets] for q, offsets in acks.items()]}
        results = self.store.append([self._message(body)])
        self._appended(results)
        return results[-1].end_offset

    def wait(self, end_offset: int) -> None:
        """Until the record is acknowledged as the store acknowledges writes (raising what
        the acknowledgement raised, e.g. NOT_ENOUGH_REPLICAS)."""
        self.store.durable(end_offset).result(WAIT_TIMEOUT_S)

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
        apply_set: Callable[[QueueKey, dict[str, Any]], None],
        apply_drop: Callable[[str], None],
        apply_acks: Callable[[QueueKey, list[int]], None],
    ) -> int:
        """Apply the records from queue offset ``start`` on, in order; where the journal ends."""
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
                    else:
                        state = dict(body["s"])
                        int(state["committed"])  # a record without it is not one of ours
                        apply_set((str(body["g"]), str(body["t"]), int(body["q"])), state)
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # not written by this module: skip it
            offset = got.next_offset

    def _message(self, body: dict[str, Any]) -> Message:
        return Message(topic=POP_TOPIC, body=json.dumps(body).encode(), queue_id=self.queue_id)
