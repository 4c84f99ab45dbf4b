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
   (``event=outbox_message_failed``) and counted;
4. a full batch loops at once; otherwise the worker sleeps until the poll
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
import multiprocessing
import os
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select

from halfmoon.metrics import MetricFamily, MetricsRegistry
from halfmoon.outbox.dialects import Claimer, NotifyListener, Outcome, make_engine
from halfmoon.outbox.outbox import Outbox, OutboxRecord, now_ms
from halfmoon.outbox.schema import SENT
from halfmoon.outbox.targets import PublishTarget, target_for_url

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
                claimed = self.run_once(owner)
            except Exception as exc:  # noqa: BLE001 — a database hiccup must not end the worker
                log.warning("event=outbox_cycle_failed worker=%s error=%r", owner, exc)
                claimed = 0
                self._stopping.wait(self.poll_interval)
            if claimed >= self.batch_size:
                continue
            with self._wake:
                if self._wakeups == seen and not self._stopping.is_set():
                    self._wake.wait(self.poll_interval)

    def run_once(self, owner: str | None = None) -> int:
        """Claim, publish and mark one batch in the calling thread; the number of rows claimed."""
        owner = owner or f"{self.instance}:once"
        with self.claimer.claim(self.batch_size, now_ms(), owner) as claim:
            if not claim.rows:
                return 0
            records = [OutboxRecord.from_row(row) for row in claim.rows]
            started = time.monotonic()
            try:
                results = self.target.publish(records)
            except Exception as exc:  # noqa: BLE001 — a target bug fails the batch, not the worker
                results = [exc] * len(records)
            published_at = now_ms()
            claim.finish(self._outcomes(records, results, published_at), published_at)
        self._account(records, results, time.monotonic() - started, published_at)
        return len(records)

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
            if attempts >= self.max_attempts:
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
            if r is not None and rec.attempts + 1 >= self.max_attempts
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


# -- several processes ------------------------------------------------------------------------


def _relay_process(
    db_url: str,
    target_url: str,
    table_prefix: str,
    options: dict[str, Any],
    stop: Any,
    running: Any,
    published: Any,
    slot: int,
) -> None:
    """A child process: one Relay until ``stop.value`` is set; publishes its counter into
    ``published[slot]``.

    The shared state is lock-free on purpose (one writer per slot, a flag the
    parent sets): a child SIGKILLed while holding a ``multiprocessing`` lock, or
    while waiting on a ``multiprocessing.Event``, leaves that lock taken or the
    event's condition counting a sleeper that never wakes, and the parent's
    next read or ``set()`` blocks forever.
    """
    signal.signal(
        signal.SIGINT, signal.SIG_IGN
    )  # Ctrl-C reaches the whole group: the parent decides
    signal.signal(signal.SIGTERM, lambda *_: setattr(stop, "value", 1))
    workers = int(options.get("workers", DEFAULT_WORKERS))
    outbox = Outbox(make_engine(db_url, pool_size=workers + 2), table_prefix=table_prefix)
    relay = Relay(outbox, target_for_url(target_url), **options)
    relay.start()
    relay.wait_listening(10.0)
    running[slot] = 1
    try:
        while not stop.value:
            time.sleep(0.05)  # the poll interval of the stop flag and the counter
            published[slot] = relay.published
    finally:
        relay.stop()
        published[slot] = relay.published


class RelayProcesses:
    """The relay in ``processes`` child processes, each a :class:`Relay` with ``workers`` threads.

    ``relay_options`` are :class:`Relay`'s keyword arguments (``workers``,
    ``batch_size``, ``poll_interval``, ...); the target is built from
    ``target_url`` in each child (``halfmoon://`` or ``amqp://``), as is the
    engine from ``db_url``. :meth:`start` returns once every child is
    claiming; :meth:`supervise` restarts a child that died (its claimed rows
    come back to the others: locks end with its connection, leases expire).
    """

    def __init__(
        self,
        db_url: str,
        target_url: str,
        *,
        processes: int = 2,
        table_prefix: str = "hm_",
        **relay_options: Any,
    ) -> None:
        if processes < 1:
            raise ValueError("processes must be at least 1")
        # spawn, not fork: the parent may already run threads and an event loop.
        self._mp = multiprocessing.get_context("spawn")
        self.db_url = db_url
        self.target_url = target_url
        self.processes = processes
        self.table_prefix = table_prefix
        self.options = relay_options
        # Lock-free shared memory: see _relay_process for why a SIGKILL forbids locks here.
        self._stop = self._mp.RawValue("b", 0)
        self._running = self._mp.RawArray("b", processes)
        self._published = self._mp.RawArray("q", processes)
        self._published_by_dead = 0  # counts of children that died, whose slot a replacement reuses
        self._children: list[Any] = [None] * processes
        self.restarts = 0

    def _spawn(self, slot: int) -> None:
        args = (
            self.db_url,
            self.target_url,
            self.table_prefix,
            self.options,
            self._stop,
            self._running,
            self._published,
            slot,
        )
        child = self._mp.Process(
            target=_relay_process, args=args, name=f"outbox-relay-process-{slot}", daemon=True
        )
        child.start()
        self._children[slot] = child

    def start(self, timeout: float = 60.0) -> RelayProcesses:
        """Start the children; wait until each runs its relay (or raise if one dies first)."""
        self._stop.value = 0
        for slot in range(self.processes):
            self._running[slot] = 0
            self._spawn(slot)
        deadline = time.monotonic() + timeout
        while sum(self._running[:]) < self.processes:
            dead = [c for c in self._children if c is not None and c.exitcode is not None]
            if dead or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    "outbox relay process failed to start (exit codes "
                    f"{[c.exitcode for c in dead]})"
                )
            time.sleep(0.05)  # poll interval of the start-up check
        log.info(
            "event=outbox_relay_processes_started processes=%d options=%r",
            self.processes,
            self.options,
        )
        return self

    @property
    def published(self) -> int:
        """Messages published by all children (each updates its count every 50 ms)."""
        return self._published_by_dead + sum(self._published[:])

    def supervise(self, stop: threading.Event, interval: float = 1.0) -> None:
        """Until ``stop`` is set, restart any child that died."""
        while not stop.wait(interval):
            for slot, child in enumerate(self._children):
                if child is not None and child.exitcode is not None and not self._stop.value:
                    log.warning(
                        "event=outbox_relay_process_died slot=%d exitcode=%s; restarting",
                        slot,
                        child.exitcode,
                    )
                    self.restarts += 1
                    # The dead child writes no more; its replacement counts from zero in the same
                    # slot.
                    self._published_by_dead += self._published[slot]
                    self._published[slot] = 0
                    self._spawn(slot)

    def stop(self, timeout: float = 15.0) -> None:
        """Ask every child to finish its batches in flight; kill the ones still running at
        ``timeout``."""
        self._stop.value = 1
        deadline = time.monotonic() + timeout
        for child in self._children:
            if child is not None:
                child.join(max(deadline - time.monotonic(), 0.01))
        for child in self._children:
            if child is not None and child.is_alive():
                log.warning("event=outbox_relay_process_stop_timeout pid=%s", child.pid)
                child.kill()
                child.join(5)

    def __enter__(self) -> RelayProcesses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
