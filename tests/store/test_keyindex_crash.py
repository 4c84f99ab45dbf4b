"""Key index after SIGKILL when entries were put after the last flush (header updated by flush)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from halfmoon.store.keyindex import KeyIndex

FOREVER = (0, 2**62)


def test_entries_put_after_the_last_flush_are_redispatched_after_a_crash(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from halfmoon.store.keyindex import KeyIndex
        index = KeyIndex(Path({str(tmp_path)!r}), slots=7, max_entries=50)
        for i in range(10):
            index.put_keys("t", [f"k{{i % 3}}", f"u{{i}}"], 100 * i, 1_000 + 10 * i)
        index.flush()
        for i in range(10, 16):  # in the page cache, header not updated: the crash drops them
            index.put_keys("t", [f"k{{i % 3}}", f"u{{i}}"], 100 * i, 1_000 + 10 * i)
        print("ready", flush=True)
        sys.stdin.read()
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert child.stdout is not None
    assert child.stdout.readline() == b"ready\n"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)

    index = KeyIndex(tmp_path, slots=7, max_entries=50)
    try:
        assert index.max_commit_log_offset() == 900
        assert index.query("t", "u9", *FOREVER, 10) == [900]
        assert index.query("t", "u12", *FOREVER, 10) == []
        # Recovery re-dispatches from the checkpoint (at or before 900): the
        # entries already there are skipped, the lost ones come back.
        for i in range(8, 16):
            index.put_keys("t", [f"k{i % 3}", f"u{i}"], 100 * i, 1_000 + 10 * i)
        for i in range(16):
            assert index.query("t", f"u{i}", *FOREVER, 10) == [100 * i]
        assert index.query("t", "k0", *FOREVER, 100) == [
            100 * i for i in range(15, -1, -1) if i % 3 == 0
        ]
    finally:
        index.close()
    reopened = KeyIndex(tmp_path, slots=7, max_entries=50)
    try:
        assert reopened.max_commit_log_offset() == 1500
        assert reopened.query("t", "u15", *FOREVER, 10) == [1500]
    finally:
        reopened.close()
