"""``halfmoon monitor``: print dead letters, retries and stuck half messages as they happen.

RocketMQ's startMonitoring. It polls the admin API every ``--interval``
(default 2 s) and prints one line per event that happened since the previous
poll (one JSON object per line with ``--json``):

- ``dead-letter``: a message arrived in a dead-letter topic (``%DLQ%<group>``),
  with the group that gave up on it, the attempts it had and its ids. The
  offsets of every dead-letter queue are read at start; what was already
  there is not printed, and a dead-letter topic created later is read from
  its first message.
- ``retrying``: more of a group's in-flight messages on a queue are being
  delivered again (after a nack, an expired invisible time or a changed one)
  than at the previous poll, with the count now and before. What was retrying
  at start is the baseline, not news.
- ``stuck-half``: a half message has waited ``--stuck-after`` (default 1 min)
  without a decision, once per transaction.
- ``parked``: a transaction was parked after the check limit, once per
  transaction.

Each poll costs one topic listing, one status read per dead-letter topic, a
scan of the new dead-letter entries only (at most ``SCAN_LIMIT`` per queue
per poll; the rest on the next poll), one group listing and one progress
read per group, and two transaction listings of at most
``TRANSACTION_LIMIT`` entries. It runs until interrupted, for ``--duration``,
or until ``--count`` events were printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

from halfmoon.cli.admin_client import AdminClient, CliError, default_admin_url, quote
from halfmoon.cli.parser import add_command, client, positive_int
from halfmoon.cli.timearg import duration

DLQ_MARK = "%DLQ%"
SCAN_LIMIT = 256
TRANSACTION_LIMIT = 1000
GROUP_NOT_FOUND = "CONSUMER_GROUP_NOT_FOUND"  # halfmoon.broker.errors.GroupNotFound's code


def register(commands: argparse._SubParsersAction) -> None:
    monitor = add_command(
        commands,
        "monitor",
        run_monitor,
        "print dead letters, retries and stuck or parked half messages as they happen",
    )
    monitor.add_argument(
        "--interval", type=duration, default=2.0, help="poll this often (default 2s)"
    )
    monitor.add_argument(
        "--stuck-after",
        dest="stuck_after",
        type=duration,
        default=60.0,
        help="report a half message undecided this long (default 1m)",
    )
    monitor.add_argument(
        "--duration", type=duration, default=None, help="stop after this long (default: never)"
    )
    monitor.add_argument(
        "--count", type=positive_int, default=None, help="stop after this many events"
    )


class Monitor:
    """The state between polls: where each dead-letter queue was read to, what was reported."""

    def __init__(self, api: AdminClient, stuck_after_ms: int) -> None:
        self.api = api
        self.stuck_after_ms = stuck_after_ms
        self.dlq_offsets: dict[tuple[str, int], int] = {}
        self.known_dlq_topics: set[str] | None = None  # None until the first poll
        self.reported_stuck: set[str] = set()
        self.reported_parked: set[str] = set()
        # (group, topic, queue) -> in-flight messages past their first delivery; None until
        # the first poll took the baseline.
        self.retrying: dict[tuple[str, str, int], int] | None = None

    def poll(self) -> Iterator[dict[str, Any]]:
        """The events since the previous poll (the first poll only takes the baseline)."""
        yield from self._dead_letters()
        yield from self._retries()
        yield from self._transactions()

    def _dead_letters(self) -> Iterator[dict[str, Any]]:
        names = [t["name"] for t in self.api.get("/v1/topics")["topics"] if DLQ_MARK in t["name"]]
        first_poll = self.known_dlq_topics is None
        known = self.known_dlq_topics or set()
        for name in names:
            queues = self.api.get(f"/v1/topics/{quote(name)}/status")["queues"]
            for queue in queues:
                key = (name, int(queue["queue_id"]))
                high = int(queue["max_offset"])
                if key not in self.dlq_offsets:
                    # Already there at start: not news. Created since: every message is.
                    start = high if first_poll or name in known else int(queue["min_offset"])
                    self.dlq_offsets[key] = start
                yield from self._new_dead_letters(name, key[1], high)
        self.known_dlq_topics = known | set(names)

    def _new_dead_letters(self, topic: str, queue_id: int, high: int) -> Iterator[dict[str, Any]]:
        offset = self.dlq_offsets[(topic, queue_id)]
        if offset >= high:
            return
        answer = self.api.get(
            f"/v1/topics/{quote(topic)}/scan",
            queue=queue_id,
            offset=offset,
            limit=SCAN_LIMIT,
            bodies="false",
        )
        for message in answer["messages"]:
            yield {
                "event": "dead-letter",
                "group": message.get("dead_letter_group"),
                "topic": topic,
                "queue_id": queue_id,
                "offset": message["queue_offset"],
                "message_id": message["message_id"],
                "origin_message_id": message.get("origin_message_id"),
                "attempts": message.get("dead_letter_attempts"),
                "tag": message.get("tag"),
                "keys": message.get("keys") or [],
                "stored_ms": message.get("store_timestamp"),
            }
        self.dlq_offsets[(topic, queue_id)] = int(
            answer.get("next_offsets", {}).get(str(queue_id), high)
        )

    def _retries(self) -> Iterator[dict[str, Any]]:
        now: dict[tuple[str, str, int], int] = {}
        for group in self.api.get("/v1/groups")["groups"]:
            name = group["name"]
            try:
                queues = self.api.get(f"/v1/groups/{quote(name)}/progress")["queues"]
            except CliError as error:
                if error.code == GROUP_NOT_FOUND:  # deleted since the listing
                    continue
                raise
            for queue in queues:
                count = int(queue.get("retrying") or 0)
                if count:
                    now[(name, queue["topic"], int(queue["queue_id"]))] = count
        before, self.retrying = self.retrying, now
        if before is None:
            return
        for (group_name, topic, queue_id), count in sorted(now.items()):
            was = before.get((group_name, topic, queue_id), 0)
            if count > was:
                yield {
                    "event": "retrying",
                    "group": group_name,
                    "topic": topic,
                    "queue_id": queue_id,
                    "retrying": count,
                    "was": was,
                }

    def _transactions(self) -> Iterator[dict[str, Any]]:
        pending = self.api.get("/v1/transactions", limit=TRANSACTION_LIMIT)["transactions"]
        for txn in pending:
            tid = txn["transaction_id"]
            if txn.get("state") == "parked" or tid in self.reported_stuck:
                continue
            if int(txn.get("age_ms") or 0) >= self.stuck_after_ms:
                self.reported_stuck.add(tid)
                yield _transaction_event("stuck-half", txn)
        parked = self.api.get("/v1/transactions/parked", limit=TRANSACTION_LIMIT)["transactions"]
        for txn in parked:
            if txn["transaction_id"] not in self.reported_parked:
                self.reported_parked.add(txn["transaction_id"])
                yield _transaction_event("parked", txn)
        # Forget decided transactions so the sets stay as small as what is pending.
        alive = {t["transaction_id"] for t in pending} | {t["transaction_id"] for t in parked}
        self.reported_stuck &= alive
        self.reported_parked &= alive


def _transaction_event(kind: str, txn: dict[str, Any]) -> dict[str, Any]:
    return {
        "event": kind,
        "transaction_id": txn["transaction_id"],
        "topic": txn.get("topic"),
        "producer_group": txn.get("producer_group"),
        "transaction_group": txn.get("transaction_group"),
        "age_ms": txn.get("age_ms"),
        "checks_sent": txn.get("checks_sent"),
        "keys": txn.get("keys") or [],
    }


def _human(event: dict[str, Any]) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
    skip = {"event"}
    fields = " ".join(
        f"{k}={','.join(v) if isinstance(v, list) else v}"
        for k, v in event.items()
        if k not in skip and v not in (None, [], "")
    )
    return f"{stamp} {event['event']} {fields}"


def run_monitor(args: argparse.Namespace) -> None:
    monitor = Monitor(client(args), int(args.stuck_after * 1000))
    deadline = None if args.duration is None else time.monotonic() + args.duration
    printed = 0
    if not args.json:
        # Said before the first event, which may be minutes away: the command is working.
        print(
            f"watching {args.admin or default_admin_url()} every {args.interval:g} s for dead "
            f"letters, retries and half messages stuck over {args.stuck_after:g} s "
            "(Ctrl-C stops)",
            flush=True,
        )
    try:
        while True:
            for event in monitor.poll():
                print(json.dumps(event) if args.json else _human(event), flush=True)
                printed += 1
                if args.count is not None and printed >= args.count:
                    return
            if deadline is not None and time.monotonic() >= deadline:
                return
            wait = args.interval
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            time.sleep(wait)  # the pacing of a poll loop, not a synchronisation
    except KeyboardInterrupt:
        sys.stdout.flush()
