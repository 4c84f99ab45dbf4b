"""A broker group's defaults, in one place: the CLI, the settings and the controller read them.

How fast a dead master is replaced, and how long a master may stall without
being replaced, both follow from the lease (docs/replication.md, "Failover
time and pauses"):

- each member's etcd lease lives ``LEASE_TTL_S`` after its last renewal, and
  is renewed every ``KEEPALIVE_INTERVAL_S`` (etcd's own clients renew every
  TTL/3; a shorter interval buys pause tolerance for one small request a
  member every half second). etcd deletes an expired lease's keys on its next
  expiry scan (every 0.5 s in etcd 3.4);
- so a master SIGKILLed loses its key ``LEASE_TTL_S - KEEPALIVE_INTERVAL_S``
  to ``LEASE_TTL_S`` (plus etcd's scan) after the kill, and a master that
  stalls (SIGSTOP, a VM or disk stall) for less than :data:`PAUSE_TOLERATED_S`
  keeps its office: its lease is renewed when it resumes, and nobody is
  elected. A longer stall may lose the lease: the master deposes itself (it
  acknowledges nothing once its renewals have failed for that long) and a
  controller appoints an in-sync replica;
- the acting controller follows the group's keys with an etcd watch and acts
  the moment the master key goes; it also looks every ``CONTROLLER_POLL_S``
  in case the watch is down. It holds its key under its member's lease, so
  a master that was also the controller loses both in the same expiry.

etcd grants no lease shorter than 2 s, so ``LEASE_TTL_S`` is the floor: a
failover cannot be faster without a failure detector other than the lease.
"""

from __future__ import annotations

from typing import Final

LEASE_TTL_S = 2
KEEPALIVE_INTERVAL_S = 0.5
# The longest stall a master is sure to survive: its last renewal may be one interval old.
PAUSE_TOLERATED_S = LEASE_TTL_S - KEEPALIVE_INTERVAL_S
CONTROLLER_POLL_S = 0.5

MODE: Final = "async"
MIN_INSYNC_REPLICAS = 1
REPLICA_MAX_LAG_MS = 10_000
REPLICA_MAX_LAG_BYTES = 64 * 1024 * 1024
