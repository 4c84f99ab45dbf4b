"""Errors of cluster coordination: etcd unreachable, a lost race, a bad name or address."""

from __future__ import annotations

from halfmoon.errors import Conflict, HalfmoonError, InvalidArgument, NotFound


class CoordinatorUnavailable(HalfmoonError):
    """No etcd endpoint answered (or it answered with a server-side failure)."""

    code = "COORDINATOR_UNAVAILABLE"
    protocol_code = "HA_NOT_AVAILABLE"
    http_status = 500


class CoordinatorConflict(Conflict):
    """A compare-and-swap lost: someone else changed the key first."""

    code = "COORDINATOR_CONFLICT"
    protocol_code = "PRECONDITION_FAILED"


class BadCoordinatorAddress(InvalidArgument):
    """A ``--coordinator`` value that is not ``etcd://HOST:PORT[,HOST:PORT...]``."""

    code = "BAD_COORDINATOR_ADDRESS"
    protocol_code = "BAD_REQUEST"


class BadClusterName(InvalidArgument):
    """A cluster, broker, proxy or setting name that cannot be a key segment."""

    code = "BAD_CLUSTER_NAME"
    protocol_code = "BAD_REQUEST"


class NoLiveBrokers(HalfmoonError):
    """Queues must be placed, and no broker of the cluster is registered (or none pinned is)."""

    code = "NO_LIVE_BROKERS"
    protocol_code = "HA_NOT_AVAILABLE"
    http_status = 409


class MemberNameTaken(Conflict):
    """Another live process (a different endpoint, its lease alive) holds this member name."""

    code = "MEMBER_NAME_TAKEN"
    protocol_code = "PRECONDITION_FAILED"


class ConsumeActionNotOnCoordinator(Conflict):
    """A transactional ack, reject or offset commit sent to a broker that does not coordinate
    its transaction group: in cluster mode a group's consume actions live on its coordinator."""

    code = "TRANSACTION_NOT_ON_COORDINATOR"
    protocol_code = "PRECONDITION_FAILED"


class ClusterKeyNotFound(NotFound):
    """A KV config key or cluster setting that is not stored in etcd."""

    code = "CLUSTER_KEY_NOT_FOUND"
    protocol_code = "NOT_FOUND"


class NotEnoughReplicas(HalfmoonError):
    """A sync-replicated broker group has fewer in-sync replicas than its
    ``min_insync_replicas``: it acknowledges nothing until enough replicas catch up.
    (Here, not in ``halfmoon.replication``: proxies must know the class to relay it.)"""

    code = "NOT_ENOUGH_REPLICAS"
    protocol_code = "HA_NOT_AVAILABLE"
    http_status = 500


class MasterDeposed(HalfmoonError):
    """This broker is no longer its group's master (its lease in etcd was lost): it
    acknowledges nothing; clients retry and reach the group's current master."""

    code = "MASTER_DEPOSED"
    protocol_code = "HA_NOT_AVAILABLE"
    http_status = 500


class MasterSwitching(HalfmoonError):
    """The group's master is handing over to a replica (a planned switchover): it takes no
    write for the moment; clients retry and reach the new master within a second or two."""

    code = "MASTER_SWITCHING"
    protocol_code = "HA_NOT_AVAILABLE"
    http_status = 500


class SwitchoverRefused(Conflict):
    """A switchover that cannot be done as asked (the target is not in sync, the group has no
    master, another switchover is running...); ``code`` says which, the message what to do."""

    code = "SWITCHOVER_REFUSED"
    protocol_code = "PRECONDITION_FAILED"


class EpochStale(HalfmoonError):
    """A proxy's write names an older epoch of the broker group than its master's own: the
    proxy has not seen the last change of master yet. Nothing of it is stored; clients retry
    and reach the group through the proxy's refreshed route."""

    code = "EPOCH_STALE"
    protocol_code = "HA_NOT_AVAILABLE"
    http_status = 500
