"""The ``[cluster]`` configuration section: how ``halfmoon broker`` and ``halfmoon proxy``
find each other and etcd (docs/cluster.md).

The section sits in the one whole-program ``Config``; the commands' flags are
shorthands for its keys, as ``serve``'s flags are for ``[server]`` and ``[store]``.
``halfmoon serve`` reads the section and ignores it.
"""

from __future__ import annotations

from dataclasses import dataclass

from halfmoon import environment
from halfmoon.errors import InvalidArgument

# A member's key lives under a lease of this many seconds (renewed every third of it);
# etcd grants no lease shorter than 2 s.
DEFAULT_TTL_S = 10
MIN_TTL_S = 2

# The older variables that name the cluster for every command (the admin tools read them
# too); HALFMOON_CLUSTER_NAME and HALFMOON_CLUSTER_COORDINATOR win over them.
LEGACY_ENV = {
    environment.CLUSTER.name: "cluster.name",
    environment.COORDINATOR.name: "cluster.coordinator",
}


@dataclass
class ClusterConfig:
    """Cluster mode: the cluster a broker or proxy joins, and each process's endpoints."""

    # The cluster to join (--cluster; also $HALFMOON_CLUSTER). With coordinator, a broker
    # registers in etcd under a lease and a proxy routes over the cluster's brokers.
    name: str | None = None
    # The cluster's etcd endpoints, etcd://HOST:PORT comma-separated (--coordinator; also
    # $HALFMOON_COORDINATOR).
    coordinator: str | None = None
    # halfmoon broker: the internal protocol endpoint (--listen); port 0: any free port.
    broker_listen: str = "127.0.0.1:8091"
    # halfmoon broker: where proxies' sends arrive over framed TCP, TLS with [internal]
    # (--send-listen), the one route of their sends. auto: the broker_listen host, any free
    # port, announced to proxies; or HOST:PORT.
    broker_send_listen: str = "auto"
    # halfmoon broker: the host proxies dial, registered in etcd with the bound port
    # (--advertise; none: the broker_listen host, or this machine's name for 0.0.0.0 or ::).
    broker_advertise_host: str | None = None
    # How long etcd keeps a broker or proxy that stopped renewing listed (--lease-ttl; whole
    # seconds, at least 2). none: 10s, and replication's 2s lease for a broker group member.
    lease_ttl_s: int | None = None
    # halfmoon proxy: one broker process's internal endpoint (--broker), for a proxy in
    # front of that broker alone instead of a whole cluster.
    proxy_broker: str | None = None
    # halfmoon proxy: its name in the cluster (--name; none: HOST-PORT of server.listen).
    proxy_name: str | None = None
    # halfmoon proxy: worker processes sharing the ports with SO_REUSEPORT (--workers;
    # cluster mode only).
    proxy_workers: int = 1

    def __post_init__(self) -> None:
        if self.lease_ttl_s is not None and self.lease_ttl_s < MIN_TTL_S:
            raise InvalidArgument(
                f"lease_ttl_s (--lease-ttl) must be at least {MIN_TTL_S} seconds, "
                f"not {self.lease_ttl_s}"
            )
        if self.proxy_workers < 1:
            raise InvalidArgument("proxy_workers (--workers) must be at least 1")

    @property
    def joined(self) -> bool:
        """Both the cluster and its coordinator are named."""
        return self.name is not None and self.coordinator is not None

    def proxy_lease_ttl_s(self) -> int:
        return self.lease_ttl_s or DEFAULT_TTL_S
