"""The store benchmark: halfmoon's MessageStore beside the raw disk and SQLite.

    python -m bench.store_bench            # full run (a few minutes on 2 cores)
    python -m bench.store_bench --quick    # a short run
    python -m bench.store_bench --messages 50000 --json out.json --dir /mnt/fast

Scenarios (every one measured on halfmoon and on the peers of ``peers.py``
in the same run, so the ratios are what matter, not absolute numbers):

* append, async flush, 128 B / 1 KiB / 16 KiB bodies, one writer thread
  calling ``store.append([message])`` once per message; the timing includes
  ``store.close()``, which flushes, as the raw peer's timing includes its
  final fsync.
* append, sync flush (group commit), 1 KiB bodies, 1 / 16 / 64 writer
  threads, each calling ``store.put([message])`` (returns once its message
  is durable) before sending the next. Time-bounded: each system runs for
  ``--sync-seconds``.
* read from the page cache: ``store.get(topic, queue, offset, 32)`` over
  every message just written (1 KiB and 128 B).

Messages look like a RocketMQ client's: a random body, a unique id (indexed
by the key index) and a tag (hashed into the consume queue).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bench import peers
from bench.report import HALFMOON, Measurement, Report, Row, Target, print_report
from halfmoon.store import record
from halfmoon.store.config import StoreConfig
from halfmoon.store.message import PROPERTY_TAGS, PROPERTY_UNIQUE_ID, Message
from halfmoon.store.store import MessageStore

REPO_ROOT = Path(__file__).resolve().parents[1]
TOPIC = "BenchTopic"
TAG = "bench"
APPEND_SIZES = (128, 1024, 16384)
READ_SIZES = (1024, 128)
SYNC_SIZE = 1024
SYNC_THREADS = (1, 16, 64)
SYNC_QUEUES = 8  # sync writers spread over this many queues, as producers do
RECORD_POOL = 256  # distinct records the peers cycle through

# The targets of the store's issue.
TARGET_ASYNC_1K = 100_000.0
TARGET_BANDWIDTH_16K = 70.0
TARGET_SYNC_64 = 20_000.0
TARGET_READ = 300_000.0


@dataclass(frozen=True, slots=True)
class Settings:
    messages: int  # per system, for 128 B and 1 KiB appends (and the reads of them)
    big_messages: int  # per system, for 16 KiB appends
    sync_seconds: float  # per system and thread count
    sqlite_batch: int  # SQLite commits every this many inserts (async peer)
    read_batch: int  # messages per store.get / rows per select
    repeat: int  # best of this many runs per measurement


def size_label(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 and size % 1024 == 0 else f"{size} B"


# -- the store under test -------------------------------------------------------


def open_store(data_dir: Path, flush: Literal["sync", "async"]) -> MessageStore:
    """Open halfmoon's store on ``data_dir`` with the given flush policy (defaults otherwise)."""
    return MessageStore(StoreConfig(data_dir=data_dir, flush=flush))


def make_message(body: bytes, index: int, queue_id: int = 0) -> Message:
    return Message(
        topic=TOPIC,
        body=body,
        queue_id=queue_id,
        properties={PROPERTY_UNIQUE_ID: f"{index:032X}", PROPERTY_TAGS: TAG},
    )


def peer_records(body: bytes) -> list[bytes]:
    """Records byte-for-byte like the store's (same codec, same fields), for the peers."""
    return [
        record.encode(make_message(body, i), i, 0, time.time_ns() // 1_000_000)
        for i in range(RECORD_POOL)
    ]


def halfmoon_append(data_dir: Path, body: bytes, count: int) -> Measurement:
    messages = [make_message(body, i) for i in range(count)]
    store = open_store(data_dir, "async")
    total = 0
    append = store.append
    t0 = time.perf_counter()
    for m in messages:
        total += append([m])[0].size
    store.close()  # flushes: the raw peer's fsync at the end, for the store
    elapsed = time.perf_counter() - t0
    return Measurement(HALFMOON, count, total, elapsed, note="append([m]) per message")


def halfmoon_read(data_dir: Path, count: int, batch: int) -> Measurement:
    store = open_store(data_dir, "async")
    try:
        get = store.get
        n = total = offset = 0
        t0 = time.perf_counter()
        while n < count:
            result = get(TOPIC, 0, offset, batch)
            if not result.messages:
                break
            for m in result.messages:
                total += m.size
            n += len(result.messages)
            offset = result.next_offset
        elapsed = time.perf_counter() - t0
    finally:
        store.close()
    if n != count:
        raise RuntimeError(f"halfmoon read {n} messages back, expected {count}")
    return Measurement(HALFMOON, n, total, elapsed, note=f"get(..., {batch})")


def halfmoon_sync(data_dir: Path, body: bytes, threads: int, seconds: float) -> Measurement:
    store = open_store(data_dir, "sync")
    sizes = [0] * threads

    def write_one(thread: int, seq: int) -> None:
        message = make_message(body, thread << 40 | seq, queue_id=thread % SYNC_QUEUES)
        sizes[thread] += store.put([message])[0].size

    try:
        n, elapsed = peers.run_writers(threads, seconds, write_one)
    finally:
        store.close()
    return Measurement(HALFMOON, n, sum(sizes), elapsed, note="put([m]): append + wait durable")


# -- running ----------------------------------------------------------------------


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Runner:
    """Runs measurements in fresh scratch directories and keeps the best of ``repeat``."""

    def __init__(self, scratch: Path, settings: Settings) -> None:
        self.scratch = scratch
        self.repeat = settings.repeat
        self._n = 0

    @contextlib.contextmanager
    def place(self) -> Iterator[Path]:
        self._n += 1
        path = self.scratch / f"m{self._n:03d}"
        path.mkdir()
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
            # Start the next measurement with no dirty pages or pending
            # deletes (the disk is mounted with discard) left by this one.
            os.sync()

    def measure(self, label: str, run: Callable[[Path], Measurement]) -> Measurement:
        results = []
        for _ in range(self.repeat):
            with self.place() as path:
                results.append(run(path))
        return _pick(label, results)

    def write_then_read(
        self,
        labels: tuple[str, str],
        write: Callable[[Path], Measurement],
        read: Callable[[Path], Measurement] | None,
    ) -> tuple[Measurement, Measurement | None]:
        """Write, then (optionally) read back what was written while it is in the page cache."""
        writes, reads = [], []
        for _ in range(self.repeat):
            with self.place() as path:
                writes.append(write(path))
                if read is not None:
                    reads.append(read(path))
        return _pick(labels[0], writes), (_pick(labels[1], reads) if reads else None)


def at(name: str, run: Callable[..., Measurement], *args: object) -> Callable[[Path], Measurement]:
    """``run(place / name, *args)`` for a scratch place chosen later."""
    return lambda place: run(place / name, *args)


def _pick(label: str, results: list[Measurement]) -> Measurement:
    best = max(results, key=lambda m: m.msgs_per_s)
    _log(f"  {label:<40} {best.system:<34} {best.msgs_per_s:>12,.0f} msgs/s")
    return best


def run_appends_and_reads(runner: Runner, settings: Settings) -> list[Row]:
    append_rows: list[Row] = []
    read_rows: dict[int, Row] = {}
    for size in APPEND_SIZES:
        count = settings.big_messages if size >= 16384 else settings.messages
        body = os.urandom(size)
        records = peer_records(body)
        record_size = len(records[0])
        batch = settings.read_batch
        row = Row(f"append_async_{size}", f"append async {size_label(size)}")
        read_row = Row(f"read_{size}", f"read page cache {size_label(size)}")
        reads = size in READ_SIZES
        _log(f"{row.scenario}: {count:,} messages per system")
        systems = [
            (
                at("store", halfmoon_append, body, count),
                at("store", halfmoon_read, count, batch),
            ),
            (
                at("raw.log", peers.raw_append, records, count),
                at("raw.log", peers.raw_read, record_size, count),
            ),
            (
                at("m.db", peers.sqlite_append, records, count, settings.sqlite_batch),
                at("m.db", peers.sqlite_read, count, batch),
            ),
        ]
        for write, read in systems:
            w, r = runner.write_then_read(
                (row.scenario, read_row.scenario), write, read if reads else None
            )
            row.measurements.append(w)
            if r is not None:
                read_row.measurements.append(r)
        append_rows.append(row)
        if reads:
            read_rows[size] = read_row
    return append_rows + [read_rows[s] for s in READ_SIZES if s in read_rows]


def run_sync(runner: Runner, settings: Settings) -> list[Row]:
    rows = []
    body = os.urandom(SYNC_SIZE)
    rec = peer_records(body)[0]
    seconds = settings.sync_seconds
    for threads in SYNC_THREADS:
        plural = "s" if threads > 1 else ""
        row = Row(
            f"append_sync_{threads}",
            f"append sync {size_label(SYNC_SIZE)}, {threads} writer{plural}",
        )
        _log(f"{row.scenario}: {seconds:g} s per system")
        systems = [
            at("store", halfmoon_sync, body, threads, seconds),
            at("raw.log", peers.raw_sync_per_writer, rec, threads, seconds),
            at("raw.log", peers.raw_group_commit, rec, threads, seconds),
            at("m.db", peers.sqlite_sync, rec, threads, seconds),
        ]
        for system in systems:
            row.measurements.append(runner.measure(row.scenario, system))
        rows.append(row)
    return rows


def check_targets(report: Report) -> list[Target]:
    targets: list[Target] = []

    def hm(key: str) -> Measurement | None:
        row = report.row(key)
        return row.halfmoon if row else None

    if m := hm("append_async_1024"):
        targets.append(Target("async append 1 KiB", m.msgs_per_s, TARGET_ASYNC_1K, "msgs/s"))
    row = report.row("append_async_16384")
    if row and row.halfmoon and (raw := row.of(peers.RAW_APPEND)) and raw.mb_per_s > 0:
        share = 100.0 * row.halfmoon.mb_per_s / raw.mb_per_s
        targets.append(
            Target("16 KiB append, % of raw disk bandwidth", share, TARGET_BANDWIDTH_16K, "%")
        )
    if m := hm("append_sync_64"):
        targets.append(
            Target("sync group commit, 64 writers", m.msgs_per_s, TARGET_SYNC_64, "msgs/s")
        )
    for size in READ_SIZES:
        if m := hm(f"read_{size}"):
            targets.append(
                Target(f"read page cache {size_label(size)}", m.msgs_per_s, TARGET_READ, "msgs/s")
            )
    return targets


# -- the machine ------------------------------------------------------------------


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory() -> str:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) // 1024:,} MiB"
    return "unknown"


def _filesystem(path: Path) -> str:
    best = ("", "unknown", "unknown")
    with contextlib.suppress(OSError):
        target = str(path.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype = line.split()[:3]
            inside = target == mount or target.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best[0]):
                best = (mount, fstype, device)
    return f"{best[1]} on {best[2]} (mounted at {best[0]})"


def _git_commit() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
        return out.stdout.strip()
    return "unknown"


def _load_average() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return " ".join(f"{x:.2f}" for x in load)


def machine_info(scratch: Path) -> dict[str, str]:
    return {
        "cpu": f"{_cpu_model()} x {os.cpu_count()}",
        "memory": _memory(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "filesystem": _filesystem(scratch),
        "commit": _git_commit(),
        "load average at start": _load_average(),
    }


# -- command line -----------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.store_bench",
        description="Benchmark halfmoon's store against the raw disk and SQLite.",
    )
    p.add_argument(
        "--quick", action="store_true", help="a short run (smaller counts, 1 s sync runs)"
    )
    p.add_argument(
        "--messages",
        type=int,
        help="messages per system for 128 B / 1 KiB (default 200000; quick 20000)",
    )
    p.add_argument(
        "--big-messages", type=int, help="messages per system for 16 KiB (default messages/4)"
    )
    p.add_argument("--sync-seconds", type=float, help="seconds per sync run (default 3; quick 1)")
    p.add_argument(
        "--sqlite-batch", type=int, default=1000, help="SQLite inserts per commit (default 1000)"
    )
    p.add_argument(
        "--repeat", type=int, default=1, help="keep the best of this many runs (default 1)"
    )
    p.add_argument(
        "--dir",
        type=Path,
        help="where to put scratch data (default: bench-results/ in the repo); removed afterwards",
    )
    p.add_argument("--json", type=Path, help="also save the results as JSON here")
    args = p.parse_args(argv)
    for name in ("messages", "big_messages", "sqlite_batch", "repeat"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.sync_seconds is not None and args.sync_seconds <= 0:
        p.error("--sync-seconds must be positive")
    return args


def settings_from(args: argparse.Namespace) -> Settings:
    messages = args.messages or (20_000 if args.quick else 200_000)
    return Settings(
        messages=messages,
        big_messages=args.big_messages or max(1, messages // 4),
        sync_seconds=args.sync_seconds or (1.0 if args.quick else 3.0),
        sqlite_batch=args.sqlite_batch,
        read_batch=32,
        repeat=args.repeat,
    )


def run(settings: Settings, parent: Path) -> Report:
    parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="store-bench-", dir=parent))
    try:
        report = Report(
            machine=machine_info(scratch),
            settings={
                "messages (128 B, 1 KiB)": settings.messages,
                "messages (16 KiB)": settings.big_messages,
                "sync seconds per system": settings.sync_seconds,
                "sqlite commit every": settings.sqlite_batch,
                "read batch": settings.read_batch,
                "best of": settings.repeat,
                "command": " ".join(
                    [Path(sys.executable).name, "-m", "bench.store_bench", *sys.argv[1:]]
                ),
            },
        )
        runner = Runner(scratch, settings)
        report.rows.extend(run_appends_and_reads(runner, settings))
        report.rows.extend(run_sync(runner, settings))
        report.targets = check_targets(report)
        return report
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    parent = args.dir or REPO_ROOT / "bench-results"
    started = time.perf_counter()
    report = run(settings, parent)
    report.settings["wall seconds"] = round(time.perf_counter() - started, 1)
    # Other work on the machine skews the numbers: show how busy it was.
    report.machine["load average at end"] = _load_average()
    print_report(report, sys.stdout)
    if args.json:
        report.save(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
