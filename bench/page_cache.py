"""What one durable 1 KiB append costs the disk, by how the file is written and advised.

    python -m bench.page_cache                 # ~20 s
    python -m bench.page_cache --dir /data --fill-mib 200

A sparse file of ``--size-mib`` is appended to 1 KiB at a time with an ``fdatasync`` after
each append, as the commit log is under ``store.flush=sync``: first at its start, then, after
``--fill-mib`` of appends, deep into it. Three ways of writing, the same run, the same disk:

* ``mmap, default advice``: what the commit log did before its mappings were advised;
* ``mmap, MADV_RANDOM``: what the store does now (halfmoon.store.commitlog);
* ``pwrite``: the peer, plain write() system calls, no mapping.

For each: the fdatasync's p50 and the bytes this process dirtied per append
(``/proc/self/io`` ``write_bytes``: what the next fdatasync writes back). On a file system with
large folios (XFS; ext4 since Linux 6.16) the default advice's deep row shows the folio size,
2 MiB, where the others show a page. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.load import machine_info, percentile

RECORD = 1024


def _written() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def _phase(
    append: Callable[[], None], fd: int, count: int, sync_every: int = 1
) -> tuple[float, float]:
    """(fdatasync p50 in ms, bytes dirtied per append) over ``count`` appends."""
    before = _written()
    latencies = []
    for i in range(count):
        append()
        if i % sync_every == 0:
            started = time.perf_counter()
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - started)
    return percentile(latencies, 0.5) * 1e3, (_written() - before) / count


def measure(way: str, directory: Path, size: int, fill: int, probes: int) -> dict[str, float]:
    path = directory / f"page-cache-{way.replace(' ', '-').replace(',', '')}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        data = os.urandom(RECORD)
        position = 0
        mm = None
        if way.startswith("mmap"):
            mm = mmap.mmap(fd, size)
            if "RANDOM" in way:
                mm.madvise(mmap.MADV_RANDOM)

        def append() -> None:
            nonlocal position
            if mm is not None:
                mm[position : position + RECORD] = data
            else:
                os.pwrite(fd, data, position)
            position += RECORD

        start_p50, start_bytes = _phase(append, fd, probes)
        _phase(append, fd, fill // RECORD, sync_every=64)  # the segment fills, synced now and then
        deep_p50, deep_bytes = _phase(append, fd, probes)
        if mm is not None:
            mm.close()
        return {"start_p50_ms": start_p50, "start_bytes": start_bytes,
                "deep_p50_ms": deep_p50, "deep_bytes": deep_bytes}  # fmt: skip
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.page_cache", description=__doc__)
    where = "where the file goes (default: a temporary directory under the working directory)"
    parser.add_argument("--dir", type=Path, help=where)
    parser.add_argument("--size-mib", type=int, default=128)
    parser.add_argument("--fill-mib", type=int, default=60)
    parser.add_argument("--probes", type=int, default=500, help="fsynced appends per phase")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    ways = ("mmap, default advice", "mmap, MADV_RANDOM", "pwrite")
    with tempfile.TemporaryDirectory(dir=args.dir or Path.cwd()) as scratch:
        rows = {
            way: measure(way, Path(scratch), args.size_mib << 20, args.fill_mib << 20, args.probes)
            for way in ways
        }
    print("| way | fdatasync p50, start (ms) | written per append, start (KiB) "
          "| fdatasync p50, deep (ms) | written per append, deep (KiB) |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: |")
    for way, r in rows.items():
        print(f"| {way} | {r['start_p50_ms']:.3f} | {r['start_bytes'] / 1024:.1f} "
              f"| {r['deep_p50_ms']:.3f} | {r['deep_bytes'] / 1024:.1f} |")  # fmt: skip
    print(f"\n{machine_info()}; {os.uname().release}; deep = after {args.fill_mib} MiB")
    if args.json:
        args.json.write_text(json.dumps({"results": rows, "machine": machine_info()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
