"""Test-only failpoints: places where a test stops or kills a real process at an exact step.

Crash tests SIGKILL real processes, but a kill sent from outside lands wherever the process
happens to be; these points let a test choose the step. Each is armed only by an environment
variable that no default configuration sets, so in production every call below reads one
variable and returns.

- ``HALFMOON_STORE_FAILPOINT=NAME=PATH`` (:func:`store`): a store truncation writes its pid to
  PATH at step NAME and waits to be killed (``tests/store/test_truncation.py``). Steps:
  ``truncate-after-log`` (the log is cut, the queues are not) and ``truncate-before-clear``
  (everything is cut, the intent file still says it is under way).
- ``HALFMOON_SPARK_SINK_FAILPOINT=NAME=PATH`` (:func:`spark_sink`): the Spark sink's driver
  writes its pid to PATH at step NAME of its commit protocol and waits to be killed
  (``tests/spark/test_sink.py``). Steps: ``before-marker``, ``after-marker-commit``,
  ``after-broker-commit``.
- ``HALFMOON_AMQP_FAILPOINT=NAME=PATH`` (:func:`amqp`): an AMQP server writes its pid to PATH
  at step NAME and waits to be killed (``tests/cluster/test_cluster_amqp_consumers.py``).
  Steps: ``queue-deleted-before-its-keys`` (a queue nobody asked to delete is gone from the
  topology and the store; its consumers' etcd directory is not).
- ``HALFMOON_TEST_TXN_CRASH_AT=NAME`` (:func:`txn_group`): a broker SIGKILLs itself at step NAME
  of a cross-broker transaction group (``tests/cluster/test_txn_group_crashes.py``); the steps
  are :data:`TXN_GROUP_POINTS`.

A process that waits at a point kills itself after :data:`WAIT_S`, so a test that dies
before killing it leaves nothing behind.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

STORE_ENV = "HALFMOON_STORE_FAILPOINT"
SPARK_SINK_ENV = "HALFMOON_SPARK_SINK_FAILPOINT"
AMQP_ENV = "HALFMOON_AMQP_FAILPOINT"
TXN_GROUP_ENV = "HALFMOON_TEST_TXN_CRASH_AT"

# The steps a transaction-group test may crash at (each is named by the matrix in tests/cluster/).
TXN_GROUP_POINTS = frozenset(
    {
        "coordinator-before-decision",  # the etcd record is written, the decision is not
        "coordinator-after-decision",  # decision durable, no participant told yet
        "coordinator-between-participants",  # after the first participant applied it
        "participant-before-apply",  # a participant's recovery got the decision, applies nothing
        "participant-after-apply",  # a participant applied the decision; its answer is lost
    }
)
# Longest a process waits at a point for the test to kill it before it kills itself.
WAIT_S = 120.0

log = logging.getLogger("halfmoon.failpoints")


def store(point: str) -> None:
    """Stop a store truncation at ``point`` when :data:`STORE_ENV` names it."""
    _wait_to_be_killed(STORE_ENV, point)


def spark_sink(point: str) -> None:
    """Stop the Spark sink's commit at ``point`` when :data:`SPARK_SINK_ENV` names it."""
    _wait_to_be_killed(SPARK_SINK_ENV, point)


def amqp(point: str) -> None:
    """Stop an AMQP server at ``point`` when :data:`AMQP_ENV` names it (it blocks the event
    loop: the process is about to be killed)."""
    _wait_to_be_killed(AMQP_ENV, point)


def txn_group(point: str) -> None:
    """SIGKILL this process at ``point`` of a transaction group when :data:`TXN_GROUP_ENV`
    names it; nothing otherwise."""
    if os.environ.get(TXN_GROUP_ENV) == point:
        log.warning("event=test_crash point=%s", point)
        os.kill(os.getpid(), signal.SIGKILL)


def _wait_to_be_killed(env: str, point: str) -> None:
    """With ``env`` set to ``point=PATH``: write the pid to PATH and wait to be killed."""
    armed, _, path = os.environ.get(env, "").partition("=")
    if armed != point or not path:
        return
    Path(path).write_text(str(os.getpid()))
    threading.Event().wait(WAIT_S)
    os.kill(os.getpid(), signal.SIGKILL)
