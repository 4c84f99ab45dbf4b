"""The ``[replication]`` configuration section: a ``halfmoon broker``'s broker group.

Its defaults are :mod:`halfmoon.config.replication_defaults`'s, written once; the
broker command's flags (``--group``, ``--replication``, ...) are shorthands for
these keys (docs/replication.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from halfmoon.config import replication_defaults as defaults
from halfmoon.errors import InvalidArgument


@dataclass
class ReplicationConfig:
    """Broker groups: a master and its replicas (halfmoon broker, with [cluster])."""

    # Join broker group NAME (--group): the first member to win the group's key in etcd is
    # its master, the others replicate its commit log. none: a broker on its own.
    group: str | None = None
    # sync: a write is acknowledged once the in-sync replicas have it; async: after the
    # master's own flush (--replication).
    mode: Literal["sync", "async"] = defaults.MODE
    # With mode sync, refuse writes (NOT_ENOUGH_REPLICAS) while fewer than this many
    # replicas are in sync; the master is not counted (--min-insync-replicas).
    min_insync_replicas: int = defaults.MIN_INSYNC_REPLICAS
    # Let proxies send pulls and bulk reads to in-sync replicas, which serve what the group
    # has committed (RocketMQ's slaveReadEnable; pops stay on the master; --replica-reads).
    replica_reads: bool = False
    # A replica not caught up for this long leaves the in-sync set (--replica-max-lag-ms).
    replica_max_lag_ms: int = defaults.REPLICA_MAX_LAG_MS
    # A replica this far behind leaves the in-sync set (--replica-max-lag-bytes).
    replica_max_lag_bytes: int = defaults.REPLICA_MAX_LAG_BYTES
    # Let the controller appoint a live member outside the in-sync set when no in-sync one
    # is left: can lose acknowledged writes (--unclean-election).
    unclean_election: bool = False

    def __post_init__(self) -> None:
        if self.min_insync_replicas < 0:
            raise InvalidArgument("min_insync_replicas (--min-insync-replicas) must be at least 0")
        if self.replica_max_lag_ms < 1 or self.replica_max_lag_bytes < 1:
            raise InvalidArgument(
                "replica_max_lag_ms (--replica-max-lag-ms) and replica_max_lag_bytes "
                "(--replica-max-lag-bytes) must be positive"
            )
