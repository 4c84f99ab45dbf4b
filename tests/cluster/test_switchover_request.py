"""A switchover request is checked against the group's keys before it is written: each wrong
request fails with its stable code (halfmoon.cluster.coordination.switchover)."""

from __future__ import annotations

import json
import time

import pytest

from halfmoon.cluster.coordination.etcd_json import KeyValue
from halfmoon.cluster.coordination.switchover import check_request
from halfmoon.cluster.errors import SwitchoverRefused


def kv(key: str, value: dict[str, object]) -> KeyValue:
    return KeyValue(key, json.dumps(value).encode(), 1, 1, 1, 0)


def keys(**extra: dict[str, object]) -> dict[str, KeyValue]:
    found = {
        "members/b0": kv("members/b0", {"endpoint": "h:1"}),
        "members/b1": kv("members/b1", {"endpoint": "h:2"}),
        "members/b2": kv("members/b2", {"endpoint": "h:3"}),
        "master": kv("master", {"member": "b0", "epoch": 3}),
        "isr": kv("isr", {"isr": ["b1"], "master": "b0"}),
    }
    for name, value in extra.items():
        found[name] = kv(name, value)
    return found


def code(group_keys: dict[str, KeyValue], to: str | None) -> str:
    with pytest.raises(SwitchoverRefused) as refused:
        check_request("g1", group_keys, to)
    return refused.value.code


def test_a_request_the_group_can_satisfy_passes() -> None:
    check_request("g1", keys(), "b1")
    check_request("g1", keys(), None)  # the in-sync replica b1 is the default


def test_each_wrong_request_has_its_code() -> None:
    assert code({}, None) == "BROKER_GROUP_NOT_FOUND"
    no_master = {k: v for k, v in keys().items() if k != "master"}
    assert code(no_master, "b1") == "SWITCHOVER_NO_MASTER"
    assert code(keys(), "b0") == "SWITCHOVER_TARGET_IS_MASTER"
    assert code(keys(), "b9") == "SWITCHOVER_TARGET_UNKNOWN"
    assert code(keys(), "b2") == "SWITCHOVER_TARGET_NOT_IN_SYNC"
    assert code(keys(isr={"isr": []}), None) == "SWITCHOVER_NO_CANDIDATE"
    now = int(time.time() * 1000)
    pending = {"state": "requested", "requested_ms": now}
    assert code(keys(switchover=pending), "b1") == "SWITCHOVER_IN_PROGRESS"
    assert code(keys(switchover={"state": "running", "requested_ms": 0}), "b1") == (
        "SWITCHOVER_IN_PROGRESS"
    )


def test_a_request_no_controller_took_for_long_may_be_replaced() -> None:
    stale = {"state": "requested", "requested_ms": int(time.time() * 1000) - 60_000}
    check_request("g1", keys(switchover=stale), "b1")
    check_request("g1", keys(switchover={"state": "done", "requested_ms": 0}), "b1")
