"""The delay timer's progress written to the commit log, so a new master starts where it was.

:class:`~halfmoon.broker.timer.DelayTimer` keeps its progress (``scan_offset``,
``low``, the bound ``B`` and the recalled keys) in ``timer.json``, which is not
replicated. In a broker group every write of that file is also appended, the
same JSON document, as a record of the internal topic ``%HM_TIMER_PROGRESS%``
(queue 0); only the newest record counts. Appended after the deliveries it
claims, it is in the log behind them: a replica holding the record holds
those deliveries, so a new master resuming from it delivers again only what
the old master delivered after its last record (one persist interval, 5 s by
default). Without a record a new master would scan the timer queue from its
start and deliver every delay message already due again.

A recall appends its record and waits until it is acknowledged as any write
is (under sync replication, once the in-sync replicas hold it), so a
recalled message is not delivered by a new master either.
"""

from __future__ import annotations

import json
from typing import Any

from halfmoon.broker.topics import TIMER_PROGRESS_TOPIC
from halfmoon.store.api import GetStatus, Store
from halfmoon.store.message import Message

WAIT_TIMEOUT_S = 30.0
RECORD_EVERY_MS = 3_600_000  # a record at least this often, so retention always leaves one


class TimerJournal:
    def __init__(self, store: Store) -> None:
        self.store = store

    def record(self, document: dict[str, Any]) -> int:
        """Append the progress; the end offset to wait for."""
        message = Message(
            topic=TIMER_PROGRESS_TOPIC, body=json.dumps(document).encode(), queue_id=0
        )
        return self.store.append([message])[0].end_offset

    def wait(self, end_offset: int) -> None:
        self.store.durable(end_offset).result(WAIT_TIMEOUT_S)

    def latest(self) -> dict[str, Any] | None:
        """The newest progress record readable, or None."""
        offset = self.store.max_offset(TIMER_PROGRESS_TOPIC, 0) - 1
        floor = self.store.min_offset(TIMER_PROGRESS_TOPIC, 0)
        while offset >= floor:
            got = self.store.get(TIMER_PROGRESS_TOPIC, 0, offset, 1)
            if got.status is GetStatus.FOUND and got.messages:
                try:
                    document = json.loads(got.messages[0].body)
                    if isinstance(document, dict) and "scan_offset" in document:
                        return document
                except ValueError:
                    pass  # not written by this module: look further back
            offset -= 1
        return None
