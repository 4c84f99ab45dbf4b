"""``TransactionConfig``: the ``transaction`` section of the configuration file.

Durations are milliseconds (``--set transaction.check_interval_ms=1s`` reads a
duration). The defaults are RocketMQ's where it has one.
"""

from __future__ import annotations

from dataclasses import dataclass

from halfmoon.errors import InvalidArgument


@dataclass
class TransactionConfig:
    # A half message without a decision is first checked this long after it was stored...
    timeout_ms: int = 6_000
    # ...by a scan that runs this often; each scan checks every due message once.
    check_interval_ms: int = 30_000
    # After this many checks actually sent without an answer the message is parked.
    check_max: int = 15
    # An unanswered check is repeated no sooner than this after it was sent (None: timeout_ms).
    # A producer that answers within it is never checked twice for one transaction, however
    # often scans run, so a slow but live producer does not run out of checks and get parked.
    check_retry_ms: int | None = None
    # Checks one producer stream may hold unanswered; more wait for the next round, uncounted, so
    # a producer's backlog stays shorter than check_retry_ms at the rate it answers (~420/s each).
    max_outstanding_checks_per_producer: int = 2_000
    # Ceiling on a producer's per-message check immunity (orphaned transaction recovery duration).
    max_immunity_ms: int = 3_600_000
    # Real time one broker tick may spend on a check scan before leaving the rest to the next tick.
    check_tick_budget_ms: int = 50
    # How often the pending set is snapshotted (bounds the restart scan), when it changed.
    snapshot_interval_ms: int = 5_000
    # Members of a transaction group committed per store append.
    group_batch_size: int = 256
    # Recent decisions kept in memory to answer repeated EndTransactions without I/O.
    decided_cache_entries: int = 65_536
    # Cluster mode: a transaction group's coordinator record stays in etcd at least this long
    # after its first decision, and until every broker that may hold members has applied it.
    group_record_retention_ms: int = 600_000
    # A transaction group undecided this long after its first member (its store time, so a
    # restart keeps it) or first consume action is rolled back by the broker, as Kafka's
    # transaction.timeout.ms; a producer may ask for its own per transaction.
    group_timeout_ms: int = 60_000
    # The longest transaction timeout a producer may ask for (Kafka's
    # transaction.max.timeout.ms); a Spark sink's batch asks for 15 minutes.
    group_timeout_max_ms: int = 900_000
    # How often the broker looks for transaction groups past their timeout.
    group_timeout_scan_ms: int = 1_000

    @property
    def retry_ms(self) -> int:
        """Least time between two checks of one transaction."""
        return self.timeout_ms if self.check_retry_ms is None else self.check_retry_ms

    def __post_init__(self) -> None:
        problems = []
        if self.timeout_ms < 0:
            problems.append("timeout_ms must be >= 0")
        if self.check_interval_ms <= 0 or self.snapshot_interval_ms <= 0:
            problems.append("check_interval_ms and snapshot_interval_ms must be positive")
        if self.check_max < 1:
            problems.append("check_max must be at least 1")
        if self.max_outstanding_checks_per_producer < 1:
            problems.append("max_outstanding_checks_per_producer must be at least 1")
        if self.check_tick_budget_ms < 0:
            problems.append("check_tick_budget_ms must be >= 0")
        if self.check_retry_ms is not None and self.check_retry_ms < 0:
            problems.append("check_retry_ms must be >= 0 (or none: the same as timeout_ms)")
        if self.max_immunity_ms < 0 or self.group_record_retention_ms < 0:
            problems.append("max_immunity_ms and group_record_retention_ms must be >= 0")
        if not 0 < self.group_timeout_ms <= self.group_timeout_max_ms:
            problems.append("group_timeout_ms must be positive and at most group_timeout_max_ms")
        if self.group_timeout_scan_ms <= 0:
            problems.append("group_timeout_scan_ms must be positive")
        if self.group_batch_size < 1 or self.decided_cache_entries < 1:
            problems.append("group_batch_size and decided_cache_entries must be positive")
        if problems:
            raise InvalidArgument(
                "invalid transaction configuration: " + "; ".join(problems), code="BAD_CONFIG"
            )
