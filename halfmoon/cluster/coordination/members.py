"""A one-shot reading of a cluster's members from etcd, for ``halfmoon cluster list``.

Standard library only (the command line must start fast). A member is listed
while its lease lives; its state says how its renewals are doing:

- ``live``: the lease was renewed within the last renewal interval (TTL / 3)
  and a bit; the member is running.
- ``late``: renewals have been missed; the member is stopped, paused or cut
  off from etcd, and its entry goes when the lease expires (``expires_in_s``).

Each broker also shows how many queues the cluster's topics place on it. A
broker that holds queues but no lease (stopped, or dead and its lease
expired) is listed too, in state ``gone``: its queues are unavailable. Each
broker group (docs/replication.md) shows its master, epoch, in-sync replicas
and members.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from halfmoon.cluster.coordination.etcd_json import KeyValue, call_sync, range_prefix_sync
from halfmoon.cluster.coordination.etcd_tls import EtcdTls
from halfmoon.cluster.coordination.keys import ClusterKeys
from halfmoon.cluster.coordination.placement import ClusterTopic

# A renewal is due every TTL / 3; one missed renewal plus this slack makes a member late.
LATE_SLACK_S = 1.0


def member_state(ttl_s: int, remaining_s: int) -> str:
    renewal_s = ttl_s / 3
    return "live" if ttl_s - remaining_s <= renewal_s + LATE_SLACK_S else "late"


def read_members(
    endpoints: Sequence[str], cluster: str, timeout: float = 5.0, *, tls: EtcdTls
) -> dict[str, Any]:
    keys = ClusterKeys(cluster)
    kvs, revision = range_prefix_sync(endpoints, keys.prefix, timeout, tls=tls)
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
                    **_lease_facts(endpoints, tls, kv.lease, timeout),
                    **_shown(record, now_ms),
                }
            )
    for broker in members["brokers"]:
        broker["queues"] = queues.get(broker["name"], 0)
    listed = {broker["name"] for broker in members["brokers"]}
    for name in sorted(set(queues) - listed):
        members["brokers"].append(
            {"name": name, "state": "gone", "expires_in_s": None, "queues": queues[name]}
        )
    groups = broker_groups(kvs, keys.prefix + "broker-groups/")
    return {"cluster": cluster, "revision": revision, **members, "broker_groups": groups}


def broker_groups(kvs: Sequence[KeyValue], prefix: str) -> list[dict[str, Any]]:
    """Each broker group's master, epoch, in-sync set and members, from its keys."""
    groups: dict[str, dict[str, Any]] = {}
    modes: dict[str, dict[str, Any]] = {}  # group -> member -> the mode it joined with
    for kv in kvs:
        if not kv.key.startswith(prefix):
            continue
        group, _, rest = kv.key[len(prefix) :].partition("/")
        try:
            record = kv.json()
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        entry = groups.setdefault(
            group, {"group": group, "master": None, "epoch": 0, "isr": [], "members": []}
        )
        if rest == "master":
            entry["master"] = record.get("member")
            entry["master_endpoint"] = record.get("endpoint")
            entry["epoch"] = max(entry["epoch"], int(record.get("epoch", 0)))
        elif rest == "epoch":
            entry["epoch"] = max(entry["epoch"], int(record.get("epoch", 0)))
            # Counted by the controller (halfmoon.replication.controller), epoch to epoch.
            entry["failovers"] = _count(record.get("failovers"))
            entry["switchovers"] = _count(record.get("switchovers"))
        elif rest == "isr":
            entry["isr"] = list(record.get("isr", []))
            entry["mode"] = record.get("mode")
            entry["min_insync_replicas"] = record.get("min_insync_replicas")
        elif rest.startswith("members/"):
            member = rest.removeprefix("members/")
            entry["members"].append(member)
            modes.setdefault(group, {})[member] = record.get("mode")
    for name, entry in groups.items():
        # The in-sync set is first published when a replica connects: until then the mode
        # is the one the master joined with (every member publishes its own).
        if not entry.get("mode") and entry["master"] is not None:
            entry["mode"] = modes.get(name, {}).get(entry["master"])
    return [groups[name] for name in sorted(groups)]


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def _shown(record: dict[str, Any], now_ms: int) -> dict[str, Any]:
    # The process's start; a record written before members published it has only the time
    # it was (re)written, which is every 30 s.
    started = record.get("started_ms", record.get("registered_ms"))
    uptime = max(now_ms - started, 0) if isinstance(started, int) else None
    hidden = ("name", "instance", "registered_ms", "started_ms")
    facts = {k: v for k, v in record.items() if k not in hidden}
    return {**facts, "uptime_ms": uptime}


def _lease_facts(
    endpoints: Sequence[str], tls: EtcdTls, lease: int, timeout: float
) -> dict[str, Any]:
    if not lease:
        return {"state": "unleased", "expires_in_s": None}
    answer = call_sync(endpoints, "/lease/timetolive", {"ID": str(lease)}, timeout, tls=tls)
    remaining = int(answer.get("TTL", -1))
    granted = int(answer.get("grantedTTL", 0))
    if remaining < 0:
        return {"state": "expired", "expires_in_s": 0}
    return {"state": member_state(granted, remaining), "expires_in_s": remaining}
