"""Outstanding transaction checks per producer stream: hand out checks as fast as producers answer.

The check scan can queue checks on a producer's telemetry stream far faster
than the producer answers them (one EndTransaction each). Unbounded, the
producer's backlog outgrows ``transaction.check_retry_ms``, every unanswered
check is sent again at each scan, the duplicates lengthen the backlog further
and transactions of a producer that *is* answering run out of checks and are
parked. :class:`OutstandingChecks` remembers, per stream, which transactions
it was asked about and has not answered yet:

- a stream with ``max_per_stream`` unanswered checks takes no more (the
  sender answers "not taken": not counted, tried again next round);
- a transaction with a check outstanding at a live stream is not checked
  again;
- an EndTransaction for the transaction, from any source, clears its check;
- a stream that ended or went silent releases all its checks (the sender
  prunes them before each batch);
- a check is *lost* (cleared, so it can be sent again) once it is
  ``lost_after_ms`` old **and** its stream has answered nothing for
  ``lost_after_ms``: a producer working through a long backlog keeps its
  checks, one that stopped answering loses them all. A check older than
  ``LOST_CEILING`` × ``lost_after_ms`` is lost even at a busy stream (its
  producer answered UNKNOWN, which sends nothing, or dropped it).
  ``lost_after_ms`` is at least :data:`MIN_LOST_AFTER_MS`: on a loaded
  machine a live producer (or this server) can go a second without an
  answer, and checks declared lost then are sent again while the first ones
  still wait at the producer; the duplicates lengthen its backlog, more
  checks outlive the ceiling, and the producer spends its time answering
  twice (a 1 s retry time measured 18,000 duplicates for 60,000 orphans).

Thread-safe: checks are recorded on the event loop, answers arrive from
whichever thread runs the EndTransaction.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

# A check at a stream that keeps answering others is lost after this many ``lost_after_ms``.
LOST_CEILING = 10
# Hard bound on remembered checks across all streams (oldest forgotten first).
MAX_ENTRIES = 1_000_000
# A stream is stalled (its checks lost) after answering nothing for at least this long.
MIN_LOST_AFTER_MS = 5_000
# Defaults of the pacing limits, until ``pace_checks`` sets others.
DEFAULT_MAX_PER_STREAM = 2_000
DEFAULT_LOST_AFTER_MS = 6_000


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass(eq=False)
class _Stream:
    client_id: str
    progress_ms: int  # last answer, or the first check sent while it had none outstanding
    checks: OrderedDict[str, int] = field(
        default_factory=OrderedDict
    )  # transaction id -> sent at, oldest first


class OutstandingChecks:
    def __init__(
        self,
        max_per_stream: int = DEFAULT_MAX_PER_STREAM,
        lost_after_ms: int = DEFAULT_LOST_AFTER_MS,
        clock: Callable[[], int] = _monotonic_ms,
    ) -> None:
        self.max_per_stream = max_per_stream
        self.lost_after_ms = max(lost_after_ms, MIN_LOST_AFTER_MS)
        self.clock = clock
        self._lock = threading.Lock()
        self._streams: dict[object, _Stream] = {}  # stream key (its outbox) -> its checks
        self._holder: dict[str, object] = {}  # transaction id -> stream key
        self.lost_total = 0
        self.released_total = 0

    def configure(
        self, *, max_per_stream: int, lost_after_ms: int, clock: Callable[[], int] | None = None
    ) -> None:
        with self._lock:
            self.max_per_stream = max_per_stream
            self.lost_after_ms = max(lost_after_ms, MIN_LOST_AFTER_MS)
            if clock is not None:
                self.clock = clock

    def __len__(self) -> int:
        return len(self._holder)

    def count(self, stream: object) -> int:
        entry = self._streams.get(stream)
        return 0 if entry is None else len(entry.checks)

    def streams(self) -> dict[object, str]:
        """Stream key -> client id of every stream with checks outstanding."""
        with self._lock:
            return {key: s.client_id for key, s in self._streams.items()}

    def has_room(self, stream: object) -> bool:
        entry = self._streams.get(stream)
        return entry is None or len(entry.checks) < self.max_per_stream

    def room(self, stream: object) -> int:
        """How many more checks ``stream`` takes (any thread)."""
        entry = self._streams.get(stream)
        return self.max_per_stream - (0 if entry is None else len(entry.checks))

    def holder(self, transaction_id: str) -> object | None:
        """The stream a check of this transaction is outstanding at, if any."""
        return self._holder.get(transaction_id)

    def awaiting(self, transaction_id: str) -> tuple[object, str] | None:
        """(stream, client id) of this transaction's check if outstanding and not lost yet; any
        thread.

        Read-only: lets the check scan skip a transaction before reading its
        half record; the next hand-off prunes and expires for real.
        """
        with self._lock:
            stream = self._holder.get(transaction_id)
            entry = self._streams.get(stream) if stream is not None else None
            if entry is None:
                return None
            sent_ms = entry.checks.get(transaction_id)
            if sent_ms is None:
                return None
            now = self.clock()
            stalled = now - entry.progress_ms >= self.lost_after_ms
            if sent_ms <= now - self.lost_after_ms * (1 if stalled else LOST_CEILING):
                return None
            return stream, entry.client_id

    def sent(self, transaction_id: str, stream: object, client_id: str) -> None:
        with self._lock:
            now = self.clock()
            self._forget(transaction_id)
            entry = self._streams.get(stream)
            if entry is None:
                entry = self._streams[stream] = _Stream(client_id, now)
            elif not entry.checks:
                entry.progress_ms = now
            entry.checks[transaction_id] = now
            self._holder[transaction_id] = stream
            if len(self._holder) > MAX_ENTRIES:
                self._forget(next(iter(self._holder)))

    def answered(self, transaction_id: str) -> None:
        """An EndTransaction arrived for this transaction (any source, any thread)."""
        if transaction_id not in self._holder:  # the common case for a producer's own decisions
            return
        with self._lock:
            stream = self._holder.get(transaction_id)
            entry = self._streams.get(stream) if stream is not None else None
            if self._forget(transaction_id) and entry is not None:
                entry.progress_ms = self.clock()

    def release(self, stream: object) -> int:
        """The stream ended or went silent: its checks are outstanding nowhere now."""
        with self._lock:
            entry = self._streams.pop(stream, None)
            if entry is None:
                return 0
            for transaction_id in entry.checks:
                self._holder.pop(transaction_id, None)
            self.released_total += len(entry.checks)
            return len(entry.checks)

    def expire(self) -> int:
        """Clear the checks that count as lost now (see the module docs); how many."""
        with self._lock:
            now = self.clock()
            lost = 0
            for entry in self._streams.values():
                stalled = now - entry.progress_ms >= self.lost_after_ms
                cutoff = now - self.lost_after_ms * (1 if stalled else LOST_CEILING)
                checks = entry.checks
                while checks:
                    transaction_id, sent_ms = next(iter(checks.items()))
                    if sent_ms > cutoff:
                        break
                    del checks[transaction_id]
                    self._holder.pop(transaction_id, None)
                    lost += 1
            self.lost_total += lost
            return lost

    def _forget(self, transaction_id: str) -> bool:
        stream = self._holder.pop(transaction_id, None)
        if stream is None:
            return False
        entry = self._streams.get(stream)
        if entry is not None:
            entry.checks.pop(transaction_id, None)
        return True
