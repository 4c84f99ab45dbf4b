"""One data directory, one process: an exclusive ``flock`` on ``<data_dir>/lock``.

Two processes on one data directory each believe they own the commit log, the
consume queues and the ``abort`` marker: both acknowledge sends at the same
offsets, and the one that closes removes the marker the other's crash recovery
depends on. So every process that opens a data directory (``halfmoon serve``,
``halfmoon broker``) first takes this lock, before it reads or writes anything
else there, and holds it for its whole life (a broker group member keeps it
across stepping down and rejoining).

- The lock is ``flock(LOCK_EX | LOCK_NB)`` on the lock file's open file
  description: the kernel releases it when the holder dies, however it dies
  (SIGKILL included), so there is no stale lock to clean up and a restart
  after a crash succeeds at once.
- The file holds the holder's pid, start time and command, one JSON object,
  written once the lock is held. A refused start reads it to say who holds
  the directory. The file is never removed: unlinking a lock file lets a
  process that opened the old inode and one that creates a new one both
  "hold" it. Its content names the last holder; only the lock counts.
- Opened with ``O_CLOEXEC``: a program the holder executes does not inherit
  the lock (Python's ``os.open`` does so by default, stated here for the
  reader of the flags).

As RocketMQ's store (its ``lock`` file under the store path) and RabbitMQ
(one node per name) do, the second process is refused, never queued behind
the first.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from halfmoon.errors import EXIT_IN_USE, Conflict

LOCK_FILE = "lock"


class DataDirInUse(Conflict):
    """Another live process holds the data directory; nothing in it was touched."""

    code = "DATA_DIR_LOCKED"
    protocol_code = "PRECONDITION_FAILED"
    exit_code = EXIT_IN_USE

    def __init__(self, data_dir: Path, holder: dict[str, object]) -> None:
        pid = holder.get("pid")
        who = f"process {pid}" if pid is not None else "another process"
        details = [f"{key} {holder[key]}" for key in ("command", "started") if key in holder]
        super().__init__(
            f"data directory {data_dir} is in use by {who}"
            + (f" ({', '.join(details)})" if details else "")
            + ": one data directory serves one process. Stop that process first, "
            "or give this one another --data-dir"
        )
        self.data_dir = data_dir
        self.holder = holder


class DataDirLock:
    """The held lock of one data directory; :meth:`release` (or process death) frees it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor drops the flock

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_data_dir(data_dir: Path | str, command: str) -> DataDirLock:
    """Take ``data_dir``'s lock (creating the directory if missing), or raise
    :class:`DataDirInUse` naming the live holder. ``command`` (``halfmoon serve``) is
    recorded for that message."""
    directory = Path(data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_FILE
    # No O_TRUNC: the holder's pid must survive a refused open.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise DataDirInUse(directory, holder) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        record = {
            "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": command,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return DataDirLock(path, fd)


@contextlib.contextmanager
def holding_data_dir(data_dir: Path | str, command: str) -> Iterator[DataDirLock]:
    """``data_dir``'s lock for the duration of the block."""
    lock = lock_data_dir(data_dir, command)
    try:
        yield lock
    finally:
        lock.release()


def read_holder(data_dir: Path | str) -> dict[str, object]:
    """What the lock file says of its last holder (``{}`` when absent or unreadable); whether
    that holder is alive is for the lock to say, not the file."""
    try:
        fd = os.open(Path(data_dir) / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        return _read_holder(fd)
    finally:
        os.close(fd)


def _read_holder(fd: int) -> dict[str, object]:
    try:
        raw = os.pread(fd, 4096, 0)
        value = json.loads(raw.decode()) if raw.strip() else {}
    except (OSError, ValueError):  # being written at this instant, or not ours
        return {}
    return value if isinstance(value, dict) else {}
