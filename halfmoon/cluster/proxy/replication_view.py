"""Broker groups as operators watch them: each replica's lag, and the metrics of replication.

Read from what replication publishes, without importing ``halfmoon.replication``
(this package sits below it): the group keys in etcd (``members.broker_groups``)
and each master's replication ``Status``, asked by its method path.

Metrics (Prometheus, on a proxy's ``/metrics``; a broker process serves no
HTTP, so the proxy asks each group's master at scrape time):

- ``halfmoon_replication_epoch{group}``: the group's epoch (it moves on every
  change of master);
- ``halfmoon_replication_in_sync_replicas{group}``: replicas in the published
  in-sync set (the master not counted);
- ``halfmoon_replication_master_up{group}``: 1 while etcd names a master;
- ``halfmoon_replication_failovers_total{group,kind}``: changes of master
  made by the controller, ``kind`` ``automatic`` (the master's lease expired)
  or ``planned`` (``cluster failover``); counted in the group's epoch key, so
  the count survives every master, controller and proxy;
- ``halfmoon_replication_lag_bytes{group,replica}`` and
  ``halfmoon_replication_lag_ms{group,replica}``: how far each replica's
  durable end is behind the master's visible end, and for how long it has not
  held the master's end (0 while it does; Kafka's replica lag time), as the
  master sees them;
- ``halfmoon_replication_replica_in_sync{group,replica}``: 1 for a replica in
  the master's in-sync set, 0 for one connected but outside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc
import msgpack  # type: ignore[import-untyped]

from halfmoon.cluster.coordination.etcd_json import range_prefix_sync
from halfmoon.cluster.coordination.keys import ClusterKeys
from halfmoon.cluster.coordination.members import broker_groups
from halfmoon.cluster.internal.internal_tls import PLAINTEXT, InternalTls
from halfmoon.cluster.internal.peer_tls import PeerTls
from halfmoon.metrics import MetricFamily

REPLICATION_STATUS = "/halfmoon.replication.v1.Replication/Status"
STATUS_TIMEOUT_S = 1.0


def replica_progress(
    endpoint: str, tls: InternalTls = PLAINTEXT, timeout_s: float = STATUS_TIMEOUT_S
) -> dict[str, Any]:
    """Each replica's progress as its master sees it: ``lag_bytes`` (how far its durable end
    is behind the master's visible end), ``lag_ms``, ``acked``, ``in_sync``; {} when the
    master does not answer in time."""
    try:
        with tls.channel(endpoint, []) as channel:
            call = channel.unary_unary(REPLICATION_STATUS)
            raw = call(msgpack.packb({}, use_bin_type=True), timeout=timeout_s)
        answer = msgpack.unpackb(raw, raw=False)
    except (grpc.RpcError, ValueError):
        return {}
    replicas = answer.get("replicas") if isinstance(answer, dict) else None
    if not isinstance(replicas, dict):
        return {}
    isr = set(answer.get("isr") or [])
    return {
        str(name): {
            "lag_bytes": p.get("lag_bytes"),
            "lag_ms": p.get("lag_ms"),
            "acked": p.get("acked"),
            "in_sync": name in isr,
            "connected": bool(p.get("streams")),
        }
        for name, p in replicas.items()
        if isinstance(p, dict)
    }


def read_groups(endpoints: Sequence[str], cluster: str, tls: PeerTls) -> list[dict[str, Any]]:
    """Each broker group from etcd, with its replicas' progress from its master."""
    prefix = ClusterKeys(cluster).prefix + "broker-groups/"
    kvs, _ = range_prefix_sync(endpoints, prefix, tls=tls.etcd)
    groups = broker_groups(kvs, prefix)
    add_progress(groups, tls.internal)
    return groups


def add_progress(groups: list[dict[str, Any]], tls: InternalTls = PLAINTEXT) -> None:
    for group in groups:
        endpoint = group.get("master_endpoint")
        group["replicas"] = replica_progress(endpoint, tls) if endpoint else {}


def replication_collector(
    endpoints: Sequence[str], cluster: str, tls: PeerTls
) -> Callable[[], Iterable[MetricFamily]]:
    """A metrics collector (``MetricsRegistry.add_collector``) for the cluster's groups."""

    def collect() -> Iterable[MetricFamily]:
        return families(read_groups(endpoints, cluster, tls))

    return collect


def families(groups: list[dict[str, Any]]) -> list[MetricFamily]:
    epoch = MetricFamily("halfmoon_replication_epoch", "gauge", "The broker group's epoch")
    in_sync = MetricFamily(
        "halfmoon_replication_in_sync_replicas",
        "gauge",
        "Replicas in the group's published in-sync set (the master not counted)",
    )
    master_up = MetricFamily(
        "halfmoon_replication_master_up", "gauge", "1 while etcd names a master of the group"
    )
    failovers = MetricFamily(
        "halfmoon_replication_failovers_total",
        "counter",
        "Changes of master made by the controller (automatic: lease expired; planned: "
        "cluster failover)",
    )
    lag_bytes = MetricFamily(
        "halfmoon_replication_lag_bytes",
        "gauge",
        "How far the replica's durable end is behind the master's visible end",
    )
    lag_ms = MetricFamily(
        "halfmoon_replication_lag_ms",
        "gauge",
        "How long the replica has not held the master's end (0 while it does)",
    )
    replica_in_sync = MetricFamily(
        "halfmoon_replication_replica_in_sync",
        "gauge",
        "1 for a replica in the master's in-sync set, 0 for one outside it",
    )
    for group in groups:
        name = group["group"]
        epoch.add(group.get("epoch", 0), group=name)
        in_sync.add(len(group.get("isr", [])), group=name)
        master_up.add(1 if group.get("master") else 0, group=name)
        failovers.add(group.get("failovers", 0), group=name, kind="automatic")
        failovers.add(group.get("switchovers", 0), group=name, kind="planned")
        for replica, progress in sorted(group.get("replicas", {}).items()):
            if isinstance(progress.get("lag_bytes"), int):
                lag_bytes.add(progress["lag_bytes"], group=name, replica=replica)
            if isinstance(progress.get("lag_ms"), int):
                lag_ms.add(progress["lag_ms"], group=name, replica=replica)
            replica_in_sync.add(1 if progress.get("in_sync") else 0, group=name, replica=replica)
    return [epoch, in_sync, master_up, failovers, lag_bytes, lag_ms, replica_in_sync]
