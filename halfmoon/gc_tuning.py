"""The cyclic garbage collector, tuned for a server that holds a large heap.

A broker's steady state allocates containers for every message it handles
(property dicts, key lists, views, protobuf wrappers) and frees nearly all of
them by reference counting: they hold no cycles. CPython's collector still
counts them: every 700 net allocations it runs a young collection, and the
young collections in turn run full ones that walk every tracked object the
process holds (recovered pending transactions, topic and group tables,
caches). Measured on the bulk read path with 300,000 long-lived objects, the
collector took 2.5 of 8.9 µs per message (docs/benchmarks.md, "The garbage
collector on the read path").

Two settings, applied once the process is ready to serve:

- ``server.gc_freeze``: collect once, then :func:`gc.freeze` what exists:
  what startup and recovery built lives as long as the process, and full
  collections no longer walk it;
- ``server.gc_young_threshold``: the young generation's threshold (CPython's
  default is 700). Cycles that do form (an exception and its traceback, a
  finished task's callbacks) are still found, a few tens of thousands of
  allocations later instead of a few hundred.

``gc_young_threshold = 0`` leaves the thresholds as CPython set them.
"""

from __future__ import annotations

import gc
import logging
import time

from halfmoon.config import ConfigError

log = logging.getLogger("halfmoon.gc")


def tune_collector(freeze: bool, young_threshold: int) -> None:
    """Apply the two settings (see the module's text) to this process."""
    if young_threshold < 0:
        raise ConfigError(
            f"server.gc_young_threshold must be 0 (CPython's own) or more, not {young_threshold}"
        )
    started = time.monotonic()
    frozen = 0
    if freeze:
        gc.collect()
        gc.freeze()
        frozen = gc.get_freeze_count()
    if young_threshold > 0:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young_threshold, middle, old)
    log.info(
        "event=gc_tuned frozen_objects=%d thresholds=%s elapsed_ms=%.1f",
        frozen,
        "/".join(map(str, gc.get_threshold())),
        (time.monotonic() - started) * 1000,
    )
