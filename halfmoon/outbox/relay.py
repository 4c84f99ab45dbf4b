"""The relay: publishes outbox rows after commit, in per-aggregate order, at least once.

Algorithm (each worker thread, any number of them in any number of processes):

1. claim a batch of *head* rows — pending, due (``next_attempt_at`` passed),
   and with no older pending/failed row of the same aggregate — with
   ``FOR UPDATE SKIP LOCKED`` (PostgreSQL, MariaDB) or a lease (SQLite); see
   :mod:`halfmoon.outbox.dialects` for why this keeps each aggregate in order;
2. publish the batch to the target (one result per message);
3. in the claim's transaction (locks) or a new one (lease): published rows
   become ``sent``; a failed row gets ``attempts + 1`` and its next attempt
   at ``min(backoff_max, backoff_initial * 2 ** (attempts - 1))`` seconds
   from now; at ``max_attempts`` it becomes ``failed``, logged
   (``event=outbox_message_failed``) and counted; a *permanent* failure (the
   target says the message itself cannot be delivered: see
   :mod:`halfmoon.outbox.failures`) becomes ``failed`` at once, parked with its
   reason (``event=outbox_message_parked``, WARNING);
4. a full batch, or one that published anything (successors in its aggregates
   are heads now), loops at once; otherwise the worker sleeps until the poll
   interval passes or a PostgreSQL NOTIFY (an insert trigger on the outbox
   table) wakes it.

A failing message holds back only the later messages of its own aggregate
(their order is the promise); everything else keeps flowing. A ``failed``
row keeps holding its aggregate back by default (``failed_blocks_aggregate``)
until an operator runs ``Outbox.retry_failed`` or deletes it: skipping it
would publish its successors out of order without anyone deciding so. Pass
``failed_blocks_aggregate=False`` to let successors go on after a failure.

A worker that dies mid-batch (SIGKILL) leaves its rows pending (its locks go
with its connection; a lease expires): they are published again, so a
message whose publish had succeeded is published twice. Consumers dedupe on
the message id (``outbox_message_id``), which is what at-least-once asks.

A separate thread deletes ``sent`` rows older than ``sent_retention`` in
transactions of at most ``cleanup_batch`` rows.

Worker threads share one GIL with the target's event loop, which builds
every protobuf / AMQP frame, so past about two workers a process is CPU-bound
in Python. :class:`RelayProcesses` runs the relay in ``processes`` child
processes (each its own engine, target connection and threads) so the
workers use every core; the claims already keep order across processes.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, select

from halfmoon.metrics import MetricFamily, MetricsRegistry
from halfmoon.outbox.dialects import Claimer, NotifyListener, Outcome
from halfmoon.outbox.failures import permanent_reason
from halfmoon.outbox.outbox import Outbox, OutboxRecord, now_ms
from halfmoon.outbox.schema import SENT
from halfmoon.outbox.targets import PublishTarget

log = logging.getLogger("halfmoon.outbox")


@dataclass(frozen=True)
class RelayStats:
    """A snapshot of one relay's counters (this process only) and the table's backlog."""

    published: int
    failed: int
    publish_errors: int
    batches: int
    pending: int
    oldest_pending_age: float
    publish_latency_p50: float  # seconds: one target.publish call
    delivery_latency_p50: float  # seconds: row created -> published
    delivery_latency_p99: float


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# The defaults of Relay and of `halfmoon outbox relay` (tests/cli/test_defaults.py keeps
# them equal). Four threads: the relay benchmark's best single-process setting
# (docs/benchmarks.md, 2.2x one worker's rate to halfmoon); a batch of 100 bounds
# what a crash republishes to 100 rows per worker.
DEFAULT_WORKERS = 4
DEFAULT_BATCH_SIZE = 100


class Relay:
    """Publishes an :class:`Outbox` to a :class:`PublishTarget` with ``workers`` threads."""

    def __init__(
        self,
        outbox: Outbox,
        target: PublishTarget,
        *,
        workers: int = DEFAULT_WORKERS,
        batch_size: int = DEFAULT_BATCH_SIZE,
        poll_interval: float = 0.5,
        max_attempts: int = 10,
        backoff_initial: float = 1.0,
        backoff_max: float = 300.0,
        lease_seconds: float = 60.0,
        failed_blocks_aggregate: bool = True,
        listen: bool = True,
        sent_retention: float | None = 3600.0,
        cleanup_interval: float = 60.0,
        cleanup_batch: int = 1000,
        metrics: MetricsRegistry | None = None,
    ) -> None:
        if workers < 1 or batch_size < 1 or max_attempts < 1:
            raise ValueError("workers, batch_size and max_attempts must be at least 1")
        self.outbox = outbox
        self.target = target
        self.workers = workers
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.max_attempts = max_attempts
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.sent_retention = sent_retention
        self.cleanup_interval = cleanup_interval
        self.cleanup_batch = cleanup_batch
        self.claimer = Claimer(
            outbox.engine,
            outbox.tables,
            lease_seconds=lease_seconds,
            failed_blocks_aggregate=failed_blocks_aggregate,
        )
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._listen = listen and outbox.backend == "postgresql"
        self._listener: NotifyListener | None = None
        self._stopping = threading.Event()
        self._wake = threading.Condition()
        self._wakeups = 0
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._published = 0
        self._failed = 0
        self._errors = 0
        self._batches = 0
        self._publish_latency: deque[float] = deque(maxlen=2000)
        self._delivery_latency: deque[float] = deque(maxlen=20000)
        self._metrics = metrics
        if metrics is not None:
            self._register_metrics(metrics)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> Relay:
        self.claimer.check()
        self.target.start()
        self._stopping.clear()
        if self._listen:
            self._listener = NotifyListener(
                self.outbox.engine, self.outbox.tables.notify_channel, self.wake
            )
            self._listener.start()
        for n in range(self.workers):
            thread = threading.Thread(
                target=self._work,
                args=(f"{self.instance}:{n}",),
                name=f"outbox-relay-{n}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        if self.sent_retention is not None:
            thread = threading.Thread(target=self._cleanup_loop, name="outbox-cleanup", daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info(
            "event=outbox_relay_started workers=%d batch=%d target=%s listen=%s",
            self.workers,
            self.batch_size,
            self.target.name,
            self._listen,
        )
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop claiming; wait up to ``timeout`` for batches in flight to finish."""
        self._stopping.set()
        self.wake()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.01))
        left = sum(t.is_alive() for t in self._threads)
        if left:
            log.warning("event=outbox_relay_stop_timeout threads_left=%d", left)
        self._threads.clear()
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        self.target.close()
        if self._metrics is not None:
            self._metrics.remove_collector(self._collect)

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_listening(self, timeout: float = 10.0) -> bool:
        """True once the NOTIFY listener is subscribed (True at once when not listening)."""
        return self._listener is None or self._listener.listening.wait(timeout)

    def wake(self) -> None:
        """Wake idle workers now (NOTIFY does this; tests and callers may too)."""
        with self._wake:
            self._wakeups += 1
            self._wake.notify_all()

    # -- the work ---------------------------------------------------------------------------

    def _work(self, owner: str) -> None:
        while not self._stopping.is_set():
            with self._wake:
                seen = self._wakeups
            try:
                claimed, sent = self._cycle(owner)
            except Exception as exc:  # noqa: BLE001 — a database hiccup must not end the worker
                log.warning("event=outbox_cycle_failed worker=%s error=%r", owner, exc)
                claimed = sent = 0
                self._stopping.wait(self.poll_interval)
            # A full batch, or one that published anything (whose successors in the same
            # aggregates are heads now), loops at once: a busy aggregate drains at the
            # relay's rate, not one message per poll.
            if claimed >= self.batch_size or sent > 0:
                continue
            with self._wake:
                if self._wakeups == seen and not self._stopping.is_set():
                    self._wake.wait(self.poll_interval)

    def run_once(self, owner: str | None = None) -> int:
        """Claim, publish and mark one batch in the calling thread; the number of rows claimed."""
        return self._cycle(owner or f"{self.instance}:once")[0]

    def _cycle(self, owner: str) -> tuple[int, int]:
        """One batch: (rows claimed, rows published)."""
        with self.claimer.claim(self.batch_size, now_ms(), owner) as claim:
            if not claim.rows:
                return 0, 0
            records = [OutboxRecord.from_row(row) for row in claim.rows]
            started = time.monotonic()
            try:
                results = self.target.publish(records)
            except Exception as exc:  # noqa: BLE001 — a target bug fails the batch, not the worker
                results = [exc] * len(records)
            published_at = now_ms()
            claim.finish(self._outcomes(records, results, published_at), published_at)
        self._account(records, results, time.monotonic() - started, published_at)
        return len(records), sum(1 for result in results if result is None)

    def _outcomes(
        self, records: Sequence[OutboxRecord], results: Sequence[BaseException | None], now: int
    ) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for record, error in zip(records, results, strict=True):
            if error is None:
                outcomes.append(Outcome(record.id))
                continue
            attempts = record.attempts + 1
            text = f"{type(error).__name__}: {error}"
            reason = permanent_reason(error)
            if reason is not None:  # parked at once: no retry can deliver it as it is
                outcomes.append(Outcome(record.id, f"permanent {reason}: {text}", None))
                log.warning(
                    "event=outbox_message_parked message_id=%s aggregate=%s/%s topic=%s "
                    "reason=%s error=%r",
                    record.message_id,
                    record.aggregate_type,
                    record.aggregate_id,
                    record.topic,
                    reason,
                    text,
                )
            elif attempts >= self.max_attempts:
                outcomes.append(Outcome(record.id, text, None))
                log.error(
                    "event=outbox_message_failed message_id=%s aggregate=%s/%s topic=%s "
                    "attempts=%d error=%r",
                    record.message_id,
                    record.aggregate_type,
                    record.aggregate_id,
                    record.topic,
                    attempts,
                    text,
                )
            else:
                delay = min(self.backoff_max, self.backoff_initial * 2 ** (attempts - 1))
                outcomes.append(Outcome(record.id, text, now + int(delay * 1000)))
                log.info(
                    "event=outbox_publish_retry message_id=%s attempts=%d delay=%.1fs error=%r",
                    record.message_id,
                    attempts,
                    delay,
                    text,
                )
        return outcomes

    def _account(
        self,
        records: Sequence[OutboxRecord],
        results: Sequence[BaseException | None],
        publish_seconds: float,
        published_at: int,
    ) -> None:
        sent = sum(1 for r in results if r is None)
        errors = len(results) - sent
        gave_up = sum(
            1
            for rec, r in zip(records, results, strict=True)
            if r is not None
            and (rec.attempts + 1 >= self.max_attempts or permanent_reason(r) is not None)
        )
        with self._lock:
            self._batches += 1
            self._published += sent
            self._errors += errors
            self._failed += gave_up
            self._publish_latency.append(publish_seconds)
            for record, result in zip(records, results, strict=True):
                if result is None and record.attempts == 0:
                    self._delivery_latency.append(max(published_at - record.created_at, 0) / 1000)
        if self._metrics is not None:
            self._m_published.inc(sent)
            self._m_errors.inc(errors)
            self._m_failed.inc(gave_up)
            self._m_publish_sum.inc(publish_seconds)
            self._m_publish_count.inc()

    # -- cleanup ------------------------------------------------------------------------------

    def _cleanup_loop(self) -> None:
        while not self._stopping.wait(self.cleanup_interval):
            try:
                self.cleanup_sent()
            except Exception as exc:  # noqa: BLE001
                log.warning("event=outbox_cleanup_failed error=%r", exc)

    def cleanup_sent(self, older_than: float | None = None, *, max_batches: int = 100) -> int:
        """Delete sent rows older than ``older_than`` seconds (default ``sent_retention``), in
        bounded batches."""
        retention = self.sent_retention if older_than is None else older_than
        if retention is None:
            return 0
        t = self.outbox.table
        cutoff = now_ms() - int(retention * 1000)
        deleted = 0
        for _ in range(max_batches):
            # Two statements: MariaDB refuses LIMIT in an IN-subquery on the deleted table.
            with self.outbox.engine.begin() as conn:
                ids = [
                    r.id
                    for r in conn.execute(
                        select(t.c.id)
                        .where(t.c.status == SENT, t.c.sent_at <= cutoff)
                        .order_by(t.c.id)
                        .limit(self.cleanup_batch)
                    ).all()
                ]
                if ids:
                    deleted += conn.execute(
                        delete(t).where(t.c.id.in_(ids), t.c.status == SENT)
                    ).rowcount
            if len(ids) < self.cleanup_batch or self._stopping.is_set():
                break
        if deleted:
            log.info("event=outbox_cleanup deleted=%d", deleted)
        return deleted

    # -- metrics --------------------------------------------------------------------------------

    @property
    def published(self) -> int:
        """Messages this relay has published so far (a counter: no database query)."""
        with self._lock:
            return self._published

    def stats(self) -> RelayStats:
        status = self.outbox.status()
        with self._lock:
            publish = list(self._publish_latency)
            delivery = list(self._delivery_latency)
            return RelayStats(
                published=self._published,
                failed=self._failed,
                publish_errors=self._errors,
                batches=self._batches,
                pending=status.pending,
                oldest_pending_age=status.oldest_pending_age,
                publish_latency_p50=_percentile(publish, 0.5),
                delivery_latency_p50=_percentile(delivery, 0.5),
                delivery_latency_p99=_percentile(delivery, 0.99),
            )

    def _register_metrics(self, registry: MetricsRegistry) -> None:
        self._m_published = registry.counter(
            "halfmoon_outbox_published_total", "Outbox messages published by this process."
        )
        self._m_errors = registry.counter(
            "halfmoon_outbox_publish_errors_total",
            "Failed publish attempts (each retried or given up).",
        )
        self._m_failed = registry.counter(
            "halfmoon_outbox_failed_total",
            "Outbox messages marked failed after their last attempt.",
        )
        self._m_publish_sum = registry.counter(
            "halfmoon_outbox_publish_seconds_sum", "Time spent in publish calls."
        )
        self._m_publish_count = registry.counter(
            "halfmoon_outbox_publish_seconds_count", "Publish calls (batches)."
        )
        registry.add_collector(self._collect)

    def _collect(self) -> list[MetricFamily]:
        stats = self.stats()
        return [
            MetricFamily("halfmoon_outbox_pending", "gauge", "Pending outbox rows.").add(
                stats.pending
            ),
            MetricFamily(
                "halfmoon_outbox_oldest_pending_age_seconds",
                "gauge",
                "Age of the oldest pending outbox row.",
            ).add(stats.oldest_pending_age),
            MetricFamily(
                "halfmoon_outbox_publish_latency_p50_seconds",
                "gauge",
                "Median time from insert to publish (recent messages).",
            ).add(stats.delivery_latency_p50),
        ]
