"""When this process started, on the wall clock: what ``cluster list`` counts UPTIME from.

A member's etcd record is rewritten every 30 s (fresh disk figures) and on every
re-registration, so the time of the write says nothing about how long the process has
run. Linux gives the start in ``/proc/self/stat`` (clock ticks since boot) and the boot
time in ``/proc/stat``; elsewhere, the time this module was first imported (early in
every halfmoon process) stands in.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

_IMPORTED_MS = int(time.time() * 1000)


@functools.cache
def process_started_ms(pid: int | None = None) -> int:
    """When process ``pid`` (this one by default) started, in ms since the epoch."""
    try:
        stat = Path(f"/proc/{pid or 'self'}/stat").read_text()
        # Field 22 (starttime); the command name before it may hold spaces, so split after it.
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        boot_s = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        started_ms = int((boot_s + start_ticks / os.sysconf("SC_CLK_TCK")) * 1000)
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_MS
    if pid is not None:
        return started_ms
    # btime is whole seconds: never later than the import that is certainly after the start.
    return min(started_ms, _IMPORTED_MS)
