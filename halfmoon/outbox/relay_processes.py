"""The outbox relay in several child processes (``halfmoon outbox relay --processes N``):
each child runs one :class:`~halfmoon.outbox.relay.Relay`, the parent supervises them."""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
import time
from typing import Any

from halfmoon.outbox.dialects import make_engine
from halfmoon.outbox.outbox import Outbox
from halfmoon.outbox.relay import DEFAULT_WORKERS, Relay
from halfmoon.outbox.targets import target_for_url

log = logging.getLogger("halfmoon.outbox")


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
