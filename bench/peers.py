"""The peers halfmoon is measured against: the raw disk and SQLite.

Every peer moves the *same record bytes* halfmoon writes (encoded with
``halfmoon.store.record``), so MB/s compare like for like. What each peer
does, precisely:

* ``raw disk`` (append): one ``os.write`` per record into a fresh file,
  one ``fsync`` at the end (inside the timing). This is the disk's
  sequential write bandwidth as Python sees it.
* ``raw write+fdatasync`` (sync): the writer threads share one file; each
  takes a lock, ``os.write``s its record, drops the lock and calls
  ``os.fdatasync`` before sending its next record. The kernel may merge
  concurrent fdatasyncs (ext4's journal does), but nothing in user space
  groups them.
* ``raw group commit`` (sync): the writer threads hand their record to one
  flusher thread and wait; the flusher writes everything queued with one
  ``os.write`` and one ``os.fdatasync``, then wakes the writers it covered.
  This is the ceiling for a Python group commit on this disk.
* ``raw pread`` (read): ``os.pread`` of one record-sized chunk at a time,
  sequentially, from the file the raw append wrote (in the page cache).
* ``sqlite WAL NORMAL`` (append): table ``m(id INTEGER PRIMARY KEY, body
  BLOB)``, ``journal_mode=WAL``, ``synchronous=NORMAL``, one ``INSERT`` per
  record, ``COMMIT`` every ``batch`` records; the WAL and database files are
  fsynced at the end (inside the timing).
* ``sqlite WAL FULL`` (sync): ``synchronous=FULL``, one transaction (so one
  WAL fsync) per record; the writer threads share one connection behind a
  lock (SQLite allows one writer at a time; separate connections would add
  its busy-wait back-off and only be slower).
* ``sqlite select`` (read): ``SELECT body ... WHERE id >= ? AND id < ?`` in
  ranges of ``batch`` rows.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.report import Measurement

RAW_APPEND = "raw disk (write, fsync at end)"
RAW_SYNC = "raw write+fdatasync per msg"
RAW_GROUP = "raw group commit (1 flusher)"
RAW_READ = "raw pread per record"
SQLITE_APPEND = "sqlite WAL NORMAL"
SQLITE_SYNC = "sqlite WAL FULL, commit per msg"
SQLITE_READ = "sqlite select by rowid range"


def run_writers(
    threads: int, seconds: float, write_one: Callable[[int, int], None]
) -> tuple[int, float]:
    """Run ``threads`` writers for about ``seconds``; return (messages, elapsed).

    Each writer calls ``write_one(thread_index, sequence)`` in a loop until the
    deadline; the call must return only when its message is durable. Elapsed
    time runs from the common start to the last writer's finish, so the tail
    of in-flight writes is counted.
    """
    start = threading.Barrier(threads + 1)
    counts = [0] * threads
    errors: list[BaseException] = []
    deadline = 0.0

    def writer(index: int) -> None:
        start.wait()
        n = 0
        try:
            while time.perf_counter() < deadline:
                write_one(index, n)
                n += 1
        except BaseException as exc:  # surfaced to the caller below
            errors.append(exc)
        counts[index] = n

    workers = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    start.wait()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return sum(counts), elapsed


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- raw disk -----------------------------------------------------------------


def raw_append(path: Path, records: Sequence[bytes], count: int) -> Measurement:
    """Write ``count`` records (cycling through ``records``), fsync at the end."""
    pool = len(records)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    total = 0
    try:
        write = os.write
        t0 = time.perf_counter()
        for i in range(count):
            total += write(fd, records[i % pool])
        os.fsync(fd)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
    return Measurement(RAW_APPEND, count, total, elapsed)


def raw_read(path: Path, record_size: int, count: int) -> Measurement:
    """Read ``count`` records of ``record_size`` back with one pread each."""
    fd = os.open(path, os.O_RDONLY)
    total = 0
    try:
        pread = os.pread
        t0 = time.perf_counter()
        position = 0
        for _ in range(count):
            chunk = pread(fd, record_size, position)
            position += record_size
            total += len(chunk)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
    if total != record_size * count:
        raise RuntimeError(f"raw read got {total} bytes, expected {record_size * count}")
    return Measurement(RAW_READ, count, total, elapsed)


def raw_sync_per_writer(path: Path, record: bytes, threads: int, seconds: float) -> Measurement:
    """Writers share a file; each writes under a lock, then fdatasyncs itself."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    lock = threading.Lock()

    def write_one(_thread: int, _seq: int) -> None:
        with lock:
            os.write(fd, record)
        os.fdatasync(fd)

    try:
        n, elapsed = run_writers(threads, seconds, write_one)
    finally:
        os.close(fd)
    return Measurement(RAW_SYNC, n, n * len(record), elapsed)


class _GroupCommitFile:
    """The minimal group commit: writers queue, one flusher writes and fdatasyncs.

    Writers queued for the same flush share one Event, so a flush wakes
    exactly the writers it covered, with one call.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._pending: list[bytes] = []
        self._batch_done = threading.Event()  # set when the pending batch is durable
        self._closed = False
        self._flusher = threading.Thread(target=self._flush_loop, daemon=True)
        self._flusher.start()

    def append_and_wait(self, record: bytes) -> None:
        with self._lock:
            self._pending.append(record)
            done = self._batch_done
            if len(self._pending) == 1:
                self._work.notify()
        done.wait()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._work.notify()
        self._flusher.join()

    def _flush_loop(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._work.wait()
                if not self._pending:
                    return
                batch, self._pending = self._pending, []
                done, self._batch_done = self._batch_done, threading.Event()
            os.write(self._fd, b"".join(batch))
            os.fdatasync(self._fd)
            done.set()


def raw_group_commit(path: Path, record: bytes, threads: int, seconds: float) -> Measurement:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    log = _GroupCommitFile(fd)
    try:
        n, elapsed = run_writers(threads, seconds, lambda _t, _s: log.append_and_wait(record))
    finally:
        log.close()
        os.close(fd)
    return Measurement(RAW_GROUP, n, n * len(record), elapsed)


# -- SQLite -------------------------------------------------------------------


def _sqlite_open(path: Path, synchronous: str) -> sqlite3.Connection:
    # isolation_level=None: the module issues no implicit BEGIN; we decide.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if mode.lower() != "wal":
        raise RuntimeError(f"SQLite refused WAL mode (got {mode})")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("CREATE TABLE IF NOT EXISTS m (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
    return conn


def sqlite_append(path: Path, records: Sequence[bytes], count: int, batch: int) -> Measurement:
    """One INSERT per record, COMMIT every ``batch``; WAL and db fsynced at the end."""
    conn = _sqlite_open(path, "NORMAL")
    pool = len(records)
    total = 0
    insert = "INSERT INTO m (body) VALUES (?)"
    try:
        execute = conn.execute
        t0 = time.perf_counter()
        execute("BEGIN")
        for i in range(count):
            rec = records[i % pool]
            execute(insert, (rec,))
            total += len(rec)
            if (i + 1) % batch == 0:
                execute("COMMIT")
                execute("BEGIN")
        execute("COMMIT")
        # synchronous=NORMAL does not fsync the WAL on commit: make the run
        # durable the way the raw peer's final fsync does.
        wal = Path(f"{path}-wal")
        if wal.exists():
            _fsync_path(wal)
        _fsync_path(path)
        elapsed = time.perf_counter() - t0
    finally:
        conn.close()
    return Measurement(SQLITE_APPEND, count, total, elapsed, note=f"commit every {batch}")


def sqlite_read(path: Path, count: int, batch: int) -> Measurement:
    """Read rows 1..count back in rowid ranges of ``batch``."""
    conn = sqlite3.connect(path, isolation_level=None)
    total = 0
    rows = 0
    query = "SELECT body FROM m WHERE id >= ? AND id < ?"
    try:
        execute = conn.execute
        t0 = time.perf_counter()
        first = 1
        while first <= count:
            end = min(first + batch, count + 1)
            for (body,) in execute(query, (first, end)):
                total += len(body)
                rows += 1
            first = end
        elapsed = time.perf_counter() - t0
    finally:
        conn.close()
    if rows != count:
        raise RuntimeError(f"sqlite read {rows} rows, expected {count}")
    return Measurement(SQLITE_READ, rows, total, elapsed, note=f"{batch} rows per select")


def sqlite_sync(path: Path, record: bytes, threads: int, seconds: float) -> Measurement:
    """One committed (fsynced) INSERT per message from ``threads`` writers."""
    conn = _sqlite_open(path, "FULL")
    lock = threading.Lock()
    insert = "INSERT INTO m (body) VALUES (?)"

    def write_one(_thread: int, _seq: int) -> None:
        with lock:  # autocommit: each INSERT is its own transaction
            conn.execute(insert, (record,))

    try:
        n, elapsed = run_writers(threads, seconds, write_one)
    finally:
        conn.close()
    return Measurement(SQLITE_SYNC, n, n * len(record), elapsed)
