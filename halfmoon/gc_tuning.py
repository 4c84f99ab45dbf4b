"""The cyclic garbage collector and the heap a server builds before it serves.

A broker allocates containers for every message it handles (property dicts,
key lists, views, protobuf wrappers) and frees nearly all of them by
reference counting: they hold no cycles. CPython's collector still counts
them, and every so many young collections it runs a full one, which walks
every tracked object the process holds, including the tens of thousands that
startup and recovery built (imported modules, configuration, the recovered
topics, groups and pending transactions) and that live as long as the
process.

With ``server.gc_freeze`` (on by default) a server collects once when it is
ready, then freezes what exists (:func:`gc.freeze`): full collections no
longer walk it. Cycles formed later are still found as before; a frozen
object freed later is still freed by its reference count, and only a cycle
among frozen objects that is dropped later would stay (startup's structures
are kept for the process's life). Measured with
``python -m bench.gc_bench`` (docs/benchmarks.md, "The garbage collector and
the startup heap"): server CPU per message 0.74–0.85× for BulkRead and
0.82–1.03× for batched sends, single-message sends unchanged; a larger
young-generation threshold on top gained nothing and cost single sends 3 %.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("halfmoon.gc")


def freeze_startup_heap(enabled: bool) -> None:
    """Collect, then move every object that exists now out of the collector's reach."""
    if not enabled:
        log.info("event=gc_not_frozen")
        return
    started = time.monotonic()
    gc.collect()
    gc.freeze()
    log.info(
        "event=gc_frozen objects=%d elapsed_ms=%.1f",
        gc.get_freeze_count(),
        (time.monotonic() - started) * 1000,
    )
