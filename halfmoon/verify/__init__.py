"""Histories of a run against a cluster under faults, and the checker that judges them.

A test (the nemesis run, ``tests/nemesis``) records what its clients did and
saw in a :class:`History`; :func:`check` says whether that history is one a
correct message broker could have produced, and counts what happened.
"""

from halfmoon.verify.checker import CheckResult, check
from halfmoon.verify.history import Decision, Delivery, History, Outcome, Send

__all__ = ["CheckResult", "Decision", "Delivery", "History", "Outcome", "Send", "check"]
