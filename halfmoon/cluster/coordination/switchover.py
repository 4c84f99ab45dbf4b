"""Asking for a planned switchover of a broker group's master (``cluster failover``).

The request is a key in etcd, ``broker-groups/<group>/switchover``, that the
acting controller (``halfmoon.replication.controller``, run by every group
member) carries out and answers in the same key (``state`` ``done`` or
``failed`` with a ``code``). A key rather than a call to the controller: the
caller needs to know only etcd (as ``cluster list --coordinator`` does), and a
controller that changes hands mid-way finds the request where it was left.

The request is checked here first, so a wrong one fails at once with a stable
code and the controller checks it again against the state it acts on:

- ``BROKER_GROUP_NOT_FOUND``: no such group (no live member);
- ``SWITCHOVER_NO_MASTER``: the group has no master (a failover is under way);
- ``SWITCHOVER_TARGET_UNKNOWN``: ``to`` is not a live member of the group;
- ``SWITCHOVER_TARGET_IS_MASTER``: ``to`` is the master already;
- ``SWITCHOVER_TARGET_NOT_IN_SYNC``: ``to`` is not in the published in-sync set
  (it may lack acknowledged writes);
- ``SWITCHOVER_NO_CANDIDATE``: no in-sync replica to hand over to;
- ``SWITCHOVER_IN_PROGRESS``: another request for the group is pending;
- ``SWITCHOVER_NO_CONTROLLER``: no controller took the request in time (it is
  withdrawn, nothing changed).

Standard library only (the command line must start fast); servers call it in a
thread. The broker-group keys are replication's, read here by name as
``members.py`` does, since this package sits below ``halfmoon.replication``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from halfmoon.cluster.coordination.etcd_json import (
    KeyValue,
    b64,
    call_sync,
    key_value,
    range_prefix_sync,
)
from halfmoon.cluster.coordination.etcd_tls import EtcdTls
from halfmoon.cluster.coordination.keys import ClusterKeys, check_name
from halfmoon.cluster.errors import SwitchoverRefused

WAIT_S = 8.0  # under the command line's 10 s wait for an admin API answer
POLL_S = 0.05
# A request left in "requested" this long was never taken (no controller): another may replace it.
STALE_REQUEST_MS = 30_000


def switchover_key(cluster: str, group: str) -> str:
    group = check_name("broker group", group)
    return f"{ClusterKeys(cluster).prefix}broker-groups/{group}/switchover"


def request_switchover(
    endpoints: Sequence[str],
    cluster: str,
    group: str,
    to: str | None = None,
    *,
    timeout_s: float = WAIT_S,
    tls: EtcdTls,
) -> dict[str, Any]:
    """Ask for a switchover and wait for its outcome: the request's final record (``epoch``,
    ``master``, ``previous``, ``fenced_ms``...); raises :class:`SwitchoverRefused`."""
    key = switchover_key(cluster, group)
    prefix = key.removesuffix("switchover")
    kvs, _ = range_prefix_sync(endpoints, prefix, tls=tls)
    keys = {kv.key[len(prefix) :]: kv for kv in kvs}
    check_request(group, keys, to)
    pending = keys.get("switchover")
    request = {
        "id": uuid.uuid4().hex,
        "to": to,
        "state": "requested",
        "requested_ms": int(time.time() * 1000),
    }
    revision = _put_if(endpoints, tls, key, json.dumps(request).encode(), pending)
    deadline = time.monotonic() + timeout_s
    current: dict[str, Any] = request
    while time.monotonic() < deadline:
        found = _get(endpoints, tls, key)
        current = _record(found)
        if current.get("id") != request["id"]:
            raise SwitchoverRefused(
                "the request was replaced by another one", code="SWITCHOVER_IN_PROGRESS"
            )
        if current.get("state") == "done":
            return current
        if current.get("state") == "failed":
            raise SwitchoverRefused(
                str(current.get("message", "the switchover failed")),
                code=str(current.get("code", "SWITCHOVER_FAILED")),
            )
        assert found is not None
        revision = found.mod_revision
        time.sleep(POLL_S)  # polling etcd for the controller's answer, with a deadline
    if current.get("state") == "requested" and _delete_if(endpoints, tls, key, revision):
        raise SwitchoverRefused(
            f"no controller took the request within {timeout_s:g}s (is any member of group "
            f"{group!r} running?); it was withdrawn and nothing changed",
            code="SWITCHOVER_NO_CONTROLLER",
        )
    raise SwitchoverRefused(
        f"the switchover did not finish within {timeout_s:g}s (state "
        f"{current.get('state')!r}); see 'cluster list' for the group's master",
        code="SWITCHOVER_UNFINISHED",
    )


def check_request(group: str, keys: dict[str, KeyValue], to: str | None) -> None:
    """Refuse a request the group's keys (as read) cannot satisfy (see the module)."""
    members = {k.removeprefix("members/") for k in keys if k.startswith("members/")}
    if not members:
        raise SwitchoverRefused(
            f"broker group {group!r} has no live member", code="BROKER_GROUP_NOT_FOUND"
        )
    master = _record(keys.get("master")).get("member")
    if not master:
        raise SwitchoverRefused(
            f"broker group {group!r} has no master now (a failover is under way); retry once "
            "'cluster list' shows one",
            code="SWITCHOVER_NO_MASTER",
        )
    isr = set(_record(keys.get("isr")).get("isr", []))
    if to is not None:
        if to == master:
            raise SwitchoverRefused(
                f"{to!r} is the master of group {group!r} already",
                code="SWITCHOVER_TARGET_IS_MASTER",
            )
        if to not in members:
            raise SwitchoverRefused(
                f"{to!r} is not a live member of group {group!r} (members: "
                f"{', '.join(sorted(members))})",
                code="SWITCHOVER_TARGET_UNKNOWN",
            )
        if to not in isr:
            raise SwitchoverRefused(
                f"{to!r} is not in the in-sync set of group {group!r} "
                f"({', '.join(sorted(isr)) or 'empty'}): it may lack acknowledged writes; "
                "wait until it catches up or choose an in-sync replica",
                code="SWITCHOVER_TARGET_NOT_IN_SYNC",
            )
    elif not (isr & members) - {master}:
        raise SwitchoverRefused(
            f"broker group {group!r} has no live in-sync replica to hand over to",
            code="SWITCHOVER_NO_CANDIDATE",
        )
    pending = _record(keys.get("switchover"))
    if pending.get("state") in ("requested", "running"):
        age_ms = int(time.time() * 1000) - int(pending.get("requested_ms", 0))
        if pending.get("state") == "running" or age_ms < STALE_REQUEST_MS:
            raise SwitchoverRefused(
                f"a switchover of group {group!r} is already {pending['state']}",
                code="SWITCHOVER_IN_PROGRESS",
            )


def _record(kv: KeyValue | None) -> dict[str, Any]:
    if kv is None:
        return {}
    try:
        value = kv.json()
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _get(endpoints: Sequence[str], tls: EtcdTls, key: str) -> KeyValue | None:
    answer = call_sync(endpoints, "/kv/range", {"key": b64(key)}, tls=tls)
    kvs = answer.get("kvs", [])
    return key_value(kvs[0]) if kvs else None


def _put_if(
    endpoints: Sequence[str], tls: EtcdTls, key: str, value: bytes, seen: KeyValue | None
) -> int:
    """Write the request if the key is as read (another caller may have written meanwhile)."""
    compare: dict[str, str] = {"key": b64(key), "result": "EQUAL"}
    if seen is not None:
        compare.update(target="MOD", mod_revision=str(seen.mod_revision))
    else:
        compare.update(target="CREATE", create_revision="0")
    put = {"request_put": {"key": b64(key), "value": b64(value)}}
    answer = call_sync(endpoints, "/kv/txn", {"compare": [compare], "success": [put]}, tls=tls)
    if not answer.get("succeeded"):
        raise SwitchoverRefused(
            "another switchover request was written at the same moment",
            code="SWITCHOVER_IN_PROGRESS",
        )
    return int(answer.get("header", {}).get("revision", 0))


def _delete_if(endpoints: Sequence[str], tls: EtcdTls, key: str, revision: int) -> bool:
    compare = {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}
    answer = call_sync(
        endpoints,
        "/kv/txn",
        {"compare": [compare], "success": [{"request_delete_range": {"key": b64(key)}}]},
        tls=tls,
    )
    return bool(answer.get("succeeded"))
