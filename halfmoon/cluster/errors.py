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
