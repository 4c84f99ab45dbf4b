"""A history: every operation clients invoked, how it ended, and every message consumers saw.

Three kinds of record, each a complete operation (invocation and completion
in one record, with both times):

- :class:`Send`: one send of one message, identified by its ``key`` (unique in
  the history, carried in the body, so a delivery names its send). A send
  may belong to a message group (FIFO), to a transaction (``txn``: the
  message's own transaction, one half message) or to a transaction group
  (``txn_group``: many half messages, one decision).
- :class:`Decision`: a commit or rollback of a transaction or a group.
- :class:`Delivery`: a consumer received the message with ``key``; ``index``
  is the order deliveries were recorded in, across every consumer. A
  delivery with ``final`` set belongs to the **final read**: after every fault
  is healed and every producer has stopped, new consumer groups read each
  topic from its beginning, which says what the store still holds (a message
  delivered during the run and gone from the store afterwards is lost too).
  :attr:`History.final_read` records that one was made.

An operation's :class:`Outcome` is ``ok`` (acknowledged), ``fail`` (refused:
it definitely did not happen) or ``unknown`` (a timeout, a lost connection, an
error after which it may or may not have happened). Tests classify their
errors; when in doubt, ``unknown`` is the safe answer: it weakens no check
into a false alarm.

A history is written as JSON lines (:meth:`History.dump`) and read back
(:meth:`History.load`), so a failed run's history can be checked again.
"""

from __future__ import annotations

import enum
import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


class Outcome(enum.StrEnum):
    OK = "ok"
    FAIL = "fail"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Send:
    key: str
    outcome: Outcome
    invoked: float
    completed: float
    producer: str = ""  # who sent: order is judged per producer and message group
    message_group: str | None = None
    txn: str | None = None
    txn_group: str | None = None
    message_id: str = ""
    error: str = ""  # the code of a failed or unknown send


@dataclass(frozen=True)
class Decision:
    """A commit or rollback of ``txn`` (a transaction's key) or of the group ``txn_group``."""

    commit: bool
    outcome: Outcome
    invoked: float
    completed: float
    txn: str | None = None
    txn_group: str | None = None
    error: str = ""


@dataclass(frozen=True)
class Delivery:
    key: str
    index: int
    at: float
    consumer: str = ""
    final: bool = False


@dataclass
class History:
    """Records appended from any thread; deliveries numbered in the order they are recorded."""

    sends: list[Send] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    final_read: bool = False  # the final read was made (its deliveries have ``final`` set)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def send(self, record: Send) -> None:
        with self._lock:
            self.sends.append(record)

    def decide(self, record: Decision) -> None:
        with self._lock:
            self.decisions.append(record)

    def deliver(self, key: str, at: float, consumer: str = "", *, final: bool = False) -> Delivery:
        with self._lock:
            record = Delivery(key, len(self.deliveries), at, consumer, final)
            self.deliveries.append(record)
            return record

    def dump(self, path: Path) -> None:
        with self._lock, path.open("w") as out:
            if self.final_read:
                out.write(json.dumps({"type": "final_read"}) + "\n")
            for kind, records in (("send", self.sends), ("decision", self.decisions),
                                  ("delivery", self.deliveries)):  # fmt: skip
                for record in records:
                    out.write(json.dumps({"type": kind, **asdict(record)}) + "\n")

    @classmethod
    def load(cls, path: Path) -> History:
        history = cls()
        for line in path.read_text().splitlines():
            fields: dict[str, Any] = json.loads(line)
            kind = fields.pop("type")
            if "outcome" in fields:
                fields["outcome"] = Outcome(fields["outcome"])
            if kind == "send":
                history.sends.append(Send(**fields))
            elif kind == "decision":
                history.decisions.append(Decision(**fields))
            elif kind == "delivery":
                history.deliveries.append(Delivery(**fields))
            elif kind == "final_read":
                history.final_read = True
            else:
                raise ValueError(f"unknown record type {kind!r} in {path}")
        return history
