"""A one-shot reading of a cluster's members from etcd, for ``halfmoon cluster list``.

Standard library only (the command line must start fast). A member is listed
while its lease lives; its state says how its renewals are doing:

- ``live``: the lease was renewed within the last renewal interval (TTL / 3)
  and a bit; the member is running.
- ``late``: renewals have been missed; the member is stopped, paused or cut
  off from etcd, and its entry goes when the lease expires (``expires_in_s``).

Each broker also shows how many queues the cluster's topics place on it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from halfmoon.cluster.etcd_json import call_sync, range_prefix_sync
from halfmoon.cluster.keys import ClusterKeys
from halfmoon.cluster.placement import ClusterTopic

# A renewal is due every TTL / 3; one missed renewal plus this slack makes a member late.
LATE_SLACK_S = 1.0


def member_state(ttl_s: int, remaining_s: int) -> str:
    renewal_s = ttl_s / 3
    return "live" if ttl_s - remaining_s <= renewal_s + LATE_SLACK_S else "late"


def read_members(endpoints: Sequence[str], cluster: str, timeout: float = 5.0) -> dict[str, Any]:
    keys = ClusterKeys(cluster)
    kvs, revision = range_prefix_sync(endpoints, keys.prefix, timeout)
    now_ms = int(time.time() * 1000)
    queues: dict[str, int] = {}
    members: dict[str, list[dict[str, Any]]] = {"brokers": [], "proxies": []}
    for kv in kvs:
        split = keys.split(kv.key)
        if split is None:
            continue
        kind, name = split
        try:
            record = kv.json()
        except ValueError:
            continue
        if kind == "topics":
            try:
                topic = ClusterTopic.from_json(record)
            except ValueError:
                continue
            for queue in topic.queues:
                queues[queue.broker] = queues.get(queue.broker, 0) + 1
        elif kind in members and isinstance(record, dict):
            members[kind].append(
                {
                    "name": name,
                    **_lease_facts(endpoints, kv.lease, timeout),
                    **_shown(record, now_ms),
                }
            )
    for broker in members["brokers"]:
        broker["queues"] = queues.get(broker["name"], 0)
    return {"cluster": cluster, "revision": revision, **members}


def _shown(record: dict[str, Any], now_ms: int) -> dict[str, Any]:
    registered = record.get("registered_ms")
    uptime = now_ms - registered if isinstance(registered, int) else None
    facts = {k: v for k, v in record.items() if k not in ("name", "instance", "registered_ms")}
    return {**facts, "uptime_ms": uptime}


def _lease_facts(endpoints: Sequence[str], lease: int, timeout: float) -> dict[str, Any]:
    if not lease:
        return {"state": "unleased", "expires_in_s": None}
    answer = call_sync(endpoints, "/lease/timetolive", {"ID": str(lease)}, timeout)
    remaining = int(answer.get("TTL", -1))
    granted = int(answer.get("grantedTTL", 0))
    if remaining < 0:
        return {"state": "expired", "expires_in_s": 0}
    return {"state": member_state(granted, remaining), "expires_in_s": remaining}
