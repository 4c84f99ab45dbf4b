"""Scrape-time metrics of what the dashboard's Overview shows: transactions and disk.

Read from the broker facade when ``/metrics`` is scraped (so a proxy reports its
broker's), never copied on the hot path: pending and parked transactions and how
long the oldest has waited, decisions by outcome, check-backs sent, unsent and
answered; the data directory's disk free and total.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from halfmoon.broker.facade import Broker
from halfmoon.metrics import MetricFamily


def overview_collector(broker: Broker, data_dir: Path | None) -> Callable[[], list[MetricFamily]]:
    def collect() -> list[MetricFamily]:
        stats = broker.transaction_stats()
        families = [
            MetricFamily(
                "halfmoon_transactions_pending",
                "gauge",
                "Half messages without a decision (parked included).",
            ).add(stats.pending),
            MetricFamily(
                "halfmoon_transactions_parked",
                "gauge",
                "Half messages that used up their check-backs and wait for an operator.",
            ).add(stats.parked),
            MetricFamily(
                "halfmoon_transactions_oldest_pending_age_seconds",
                "gauge",
                "How long the oldest undecided half message has waited (0 with none).",
            ).add(stats.oldest_pending_age_ms / 1000),
            MetricFamily(
                "halfmoon_transaction_decisions_total",
                "counter",
                "Transactions decided, by outcome.",
            )
            .add(stats.committed_total, outcome="commit")
            .add(stats.rolled_back_total, outcome="rollback"),
            MetricFamily(
                "halfmoon_transactions_parked_total",
                "counter",
                "Transactions parked after their last unanswered check-back.",
            ).add(stats.parked_total),
            MetricFamily(
                "halfmoon_transaction_checks_sent_total",
                "counter",
                "Check-backs sent to a live producer of the transaction's producer group.",
            ).add(stats.checks_sent_total),
            MetricFamily(
                "halfmoon_transaction_checks_unsent_total",
                "counter",
                "Check-backs due with no live producer to send them to.",
            ).add(stats.checks_unsent_total),
            MetricFamily(
                "halfmoon_transaction_checks_answered_total",
                "counter",
                "Check-backs a producer answered (commit, rollback or unknown).",
            ).add(stats.checks_answered_total),
        ]
        if data_dir is not None:
            try:
                usage = shutil.disk_usage(data_dir)
            except OSError:
                usage = None  # a proxy's configured data directory need not exist
            if usage is not None:
                families.append(
                    MetricFamily(
                        "halfmoon_disk_free_bytes",
                        "gauge",
                        "Free space on the data directory's file system.",
                    ).add(usage.free)
                )
                families.append(
                    MetricFamily(
                        "halfmoon_disk_total_bytes",
                        "gauge",
                        "Size of the data directory's file system.",
                    ).add(usage.total)
                )
        return families

    return collect
