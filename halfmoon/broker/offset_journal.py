"""Committed offsets written to the commit log, so they move with it (to replicas, past crashes).

Each change of the :class:`~halfmoon.broker.offsets.OffsetTable` is appended,
under the table's lock, as one record of the internal topic ``%HM_OFFSETS%``
(queue 0): a JSON body ``{"g": group, "t": topic, "q": queue id, "o": offset}``,
or ``{"forget": {"g": group|null, "t": topic|null}}`` when a group or topic is
deleted. Appended under the lock, the records' order is the order the table
changed in, so replaying them gives the same table.

The table's snapshot (``offsets.json``) says up to which record of the
journal it holds (``journal_offset``: a queue offset of ``%HM_OFFSETS%``);
opening the table replays the records after it. A replica's log holds the
journal like any topic, so a broker opened on a replica's store (after a
failover) finds every offset committed on the master that reached it.

An offset commit waits until its record is durable *as the store acknowledges
writes*: under a sync-replicated broker group that is once the in-sync
replicas hold it (``ReplicatedStore.durable``).

**Full records** keep retention from aging offsets out (a compaction): now
and then (see ``OffsetTable.persist``) the whole table is appended, in one
append, as ``{"full": n}`` followed by one record per offset. Replaying
``full`` clears the table, so a replica replaying from the oldest retained
record ends with the right table as long as one full record is retained:
one is written at least every ``FULL_EVERY_S`` (an hour), and the log keeps
days.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from halfmoon.broker.topics import OFFSETS_TOPIC
from halfmoon.store.api import GetStatus, Store
from halfmoon.store.message import Message

WAIT_TIMEOUT_S = 30.0
FULL_EVERY_S = 3600.0  # a full record at least this often (retention keeps days of log)
FULL_EVERY_RECORDS = 1000  # ... or after this many records (or twice the table's size)
_REPLAY_BATCH = 256


class OffsetJournal:
    def __init__(self, store: Store) -> None:
        self.store = store

    def record_set(self, group: str, topic: str, queue_id: int, offset: int) -> int:
        """Append one commit; the end offset to wait for."""
        return self._append({"g": group, "t": topic, "q": queue_id, "o": offset})

    def record_forget(self, group: str | None, topic: str | None) -> int:
        return self._append({"forget": {"g": group, "t": topic}})

    def record_full(self, offsets: dict[tuple[str, str, int], int]) -> int:
        """Append the whole table (one append: all of it or none); the end offset."""
        bodies: list[dict[str, Any]] = [{"full": len(offsets)}]
        bodies += [{"g": g, "t": t, "q": q, "o": o} for (g, t, q), o in sorted(offsets.items())]
        messages = [
            Message(topic=OFFSETS_TOPIC, body=json.dumps(body).encode(), queue_id=0)
            for body in bodies
        ]
        return self.store.append(messages)[-1].end_offset

    def _append(self, body: dict[str, Any]) -> int:
        message = Message(topic=OFFSETS_TOPIC, body=json.dumps(body).encode(), queue_id=0)
        return self.store.append([message])[0].end_offset

    def wait(self, end_offset: int) -> None:
        """Until the record is acknowledged as the store acknowledges writes (raising what
        the acknowledgement raised, e.g. NOT_ENOUGH_REPLICAS)."""
        self.store.durable(end_offset).result(WAIT_TIMEOUT_S)

    @property
    def end(self) -> int:
        """The queue offset the next record will have."""
        return self.store.max_offset(OFFSETS_TOPIC, 0)

    def replay(
        self,
        start: int,
        apply_set: Callable[[str, str, int, int], None],
        apply_forget: Callable[[str | None, str | None], object],
        apply_clear: Callable[[], object],
    ) -> int:
        """Apply the records from queue offset ``start`` on; where the journal ends."""
        offset = max(start, self.store.min_offset(OFFSETS_TOPIC, 0))
        while True:
            got = self.store.get(OFFSETS_TOPIC, 0, offset, _REPLAY_BATCH)
            if got.status is not GetStatus.FOUND:
                return offset
            for stored in got.messages:
                try:
                    body = json.loads(stored.body)
                    if "full" in body:
                        apply_clear()
                    elif "forget" in body:
                        apply_forget(body["forget"].get("g"), body["forget"].get("t"))
                    else:
                        apply_set(str(body["g"]), str(body["t"]), int(body["q"]), int(body["o"]))
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # not written by this module: skip it
            offset = got.next_offset
