"""The data directory lock (``halfmoon.store.dirlock``): refused while held, named holder,
released on close and when its holder process is SIGKILLed."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from halfmoon.errors import EXIT_IN_USE
from halfmoon.store.dirlock import (
    LOCK_FILE,
    DataDirInUse,
    holding_data_dir,
    lock_data_dir,
    read_holder,
)

HOLDER = """
import sys
from halfmoon.store.dirlock import lock_data_dir
lock = lock_data_dir(sys.argv[1], "halfmoon test-holder")
print("held", flush=True)
sys.stdin.read()
"""


def test_a_held_directory_is_refused_with_its_holder_named(tmp_path: Path) -> None:
    with holding_data_dir(tmp_path / "d", "halfmoon serve") as lock:
        assert lock.held
        with pytest.raises(DataDirInUse) as refused:
            lock_data_dir(tmp_path / "d", "halfmoon broker")
        error = refused.value
        assert error.code == "DATA_DIR_LOCKED" and error.exit_code == EXIT_IN_USE == 3
        assert error.holder["pid"] == os.getpid()
        assert f"in use by process {os.getpid()} (command halfmoon serve" in error.message
        # The refused attempt left the holder's record as it was.
        assert read_holder(tmp_path / "d")["command"] == "halfmoon serve"
    assert not lock.held
    with holding_data_dir(tmp_path / "d", "halfmoon broker"):
        assert read_holder(tmp_path / "d")["command"] == "halfmoon broker"


def test_the_directory_is_created_and_the_lock_file_kept(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    with holding_data_dir(target, "halfmoon serve"):
        assert sorted(p.name for p in target.iterdir()) == [LOCK_FILE]
    # Never removed: unlinking would let two processes lock two inodes of one name.
    assert (target / LOCK_FILE).exists()


def test_an_unreadable_record_still_refuses(tmp_path: Path) -> None:
    with holding_data_dir(tmp_path, "halfmoon serve"):
        (tmp_path / LOCK_FILE).write_text("not json")
        with pytest.raises(DataDirInUse, match="in use by another process"):
            lock_data_dir(tmp_path, "halfmoon serve")


def test_the_kernel_releases_the_lock_of_a_killed_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(DataDirInUse) as refused:
            lock_data_dir(tmp_path, "halfmoon serve")
        assert refused.value.holder["pid"] == holder.pid
        holder.kill()
        holder.wait(10)
        with holding_data_dir(tmp_path, "halfmoon serve"):  # at once: nothing to clean up
            assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    finally:
        holder.kill()
        holder.wait(10)


# What opens a data directory's contents: the store, the local users file, a broker's metadata.
OPENERS = {"MessageStore", "local_guard", "InProcessBroker"}
# The two commands that open one, each under the lock (tests/server/test_data_dir_lock.py,
# tests/cluster/test_broker_data_dir_lock.py).
LOCK_HOLDERS = {"halfmoon/server/app.py", "halfmoon/broker_node.py"}


def test_only_the_lock_holders_open_a_data_directory() -> None:
    """No other command (the CLI's others talk to a running server) and no other module opens
    a data directory, so none can do so without the lock."""
    root = Path(__file__).resolve().parents[2]
    opening: set[str] = set()
    for path in (root / "halfmoon").rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                called = node.func
                name = called.id if isinstance(called, ast.Name) else getattr(called, "attr", "")
                if name in OPENERS:
                    opening.add(str(path.relative_to(root)))
    assert opening == LOCK_HOLDERS
