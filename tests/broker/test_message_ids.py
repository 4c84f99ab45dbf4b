"""Message ids: RocketMQ 5's shape, unique within a process and across forked workers."""

from __future__ import annotations

import multiprocessing
import os
import re

from halfmoon.broker.message import new_message_id

ID = re.compile(r"01[0-9A-F]{32}")


def _ids_in_child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put([new_message_id() for _ in range(1000)])


def test_ids_have_rocketmqs_shape_and_do_not_repeat() -> None:
    ids = [new_message_id() for _ in range(10_000)]
    assert all(ID.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert f"{os.getpid() & 0xFFFF:04X}" == ids[0][14:18]


def test_a_forked_process_does_not_repeat_its_parents_ids() -> None:
    """A proxy's workers are forked after the module is imported: each must make its own ids
    (the parent's counter and prefix are copied into the child)."""
    before = new_message_id()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_ids_in_child, args=(queue,))
    child.start()
    theirs = queue.get(timeout=30)
    child.join(30)
    ours = [new_message_id() for _ in range(1000)]
    assert not set(theirs) & set(ours)
    assert theirs[0][:18] != before[:18]  # its own prefix: random bytes and its process id
    assert theirs[0][14:18] == f"{child.pid & 0xFFFF:04X}"
