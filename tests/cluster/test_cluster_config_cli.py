"""``halfmoon cluster kv|settings`` against a real etcd, read back by the servers' own code."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.coordination.metadata import ClusterMetadata
from halfmoon.cluster.coordination.view import ClusterView
from tests.cli.test_cli import failed, halfmoon, ok, table
from tests.cluster.etcd_server import EtcdServer, free_port


def run(etcd: EtcdServer, cluster: str, *args: str) -> Any:
    where = ("--coordinator", etcd.url, "--cluster", cluster)
    return halfmoon("cluster", *args, *where)


def test_kv_config_is_stored_listed_and_deleted_per_namespace(
    etcd: EtcdServer, cluster_name: str
) -> None:
    # mqadmin updateOrderConf -t orders -v broker-a:4;broker-b:4 -m put
    ok(
        run(
            etcd,
            cluster_name,
            "kv",
            "set",
            "orders=broker-a:4;broker-b:4",
            "-s",
            "ORDER_TOPIC_CONFIG",
        )
    )
    ok(
        run(
            etcd,
            cluster_name,
            "kv",
            "set",
            "ns%payments=b1:2",
            "--kv-namespace",
            "ORDER_TOPIC_CONFIG",
        )
    )
    ok(run(etcd, cluster_name, "kv", "set", "retention=7d", "expr=a=b", "-s", "custom"))
    ok(run(etcd, cluster_name, "kv", "set", "retention=14d", "-s", "custom"))  # overwrites
    got = json.loads(
        ok(run(etcd, cluster_name, "kv", "get", "orders", "-s", "ORDER_TOPIC_CONFIG", "--json"))
    )
    assert got == {
        "namespace": "ORDER_TOPIC_CONFIG",
        "key": "orders",
        "value": "broker-a:4;broker-b:4",
    }
    assert ok(run(etcd, cluster_name, "kv", "get", "retention", "-s", "custom")) == "14d\n"
    listed = json.loads(ok(run(etcd, cluster_name, "kv", "list", "--json")))["kv"]
    assert [(e["namespace"], e["key"], e["value"]) for e in listed] == [
        ("ORDER_TOPIC_CONFIG", "ns%payments", "b1:2"),
        ("ORDER_TOPIC_CONFIG", "orders", "broker-a:4;broker-b:4"),
        ("custom", "expr", "a=b"),
        ("custom", "retention", "14d"),
    ]
    ok(run(etcd, cluster_name, "kv", "delete", "expr", "-s", "custom"))
    rows = table(ok(run(etcd, cluster_name, "kv", "list", "-s", "custom")))
    assert rows == [["NAMESPACE", "KEY", "VALUE"], ["custom", "retention", "14d"]]
    assert ok(run(etcd, cluster_name, "kv", "delete", "retention", "-s", "custom")) == (
        "deleted custom/retention\n"
    )
    line = failed(run(etcd, cluster_name, "kv", "get", "retention", "-s", "custom"))
    assert "(CLUSTER_KEY_NOT_FOUND)" in line
    line = failed(run(etcd, cluster_name, "kv", "delete", "retention", "-s", "custom"))
    assert "(CLUSTER_KEY_NOT_FOUND)" in line
    assert (
        ok(run(etcd, cluster_name, "kv", "list", "-s", "custom"))
        == "no KV config in namespace custom\n"
    )
    # Another cluster in the same etcd sees none of it.
    assert json.loads(ok(run(etcd, cluster_name + "x", "kv", "list", "--json"))) == {"kv": []}


def test_settings_set_by_the_cli_reach_every_process_view(
    etcd: EtcdServer, cluster_name: str
) -> None:
    async def scenario() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            view = ClusterView(client, cluster_name)
            await view.start()
            try:
                assignments = ("max_batch=64", "drain=true", "label=east 1", 'limits={"a": 1}')
                changed = await asyncio.to_thread(
                    lambda: ok(run(etcd, cluster_name, "settings", "set", *assignments, "--json"))
                )
                expected = {"max_batch": 64, "drain": True, "label": "east 1", "limits": {"a": 1}}
                assert json.loads(changed) == {"changed": expected}
                await view.wait_for(lambda v: v.settings == expected, 2.0)
                assert await ClusterMetadata(client, cluster_name).settings() == expected
            finally:
                await view.stop()

    asyncio.run(scenario())
    out = json.loads(ok(run(etcd, cluster_name, "settings", "get", "max_batch", "--json")))
    assert out == {"key": "max_batch", "value": 64}
    assert table(ok(run(etcd, cluster_name, "settings", "get")))[0] == ["KEY", "VALUE"]
    ok(run(etcd, cluster_name, "settings", "delete", "drain"))
    line = failed(run(etcd, cluster_name, "settings", "get", "drain"))
    assert "(CLUSTER_KEY_NOT_FOUND)" in line
    assert (
        "drain"
        not in json.loads(ok(run(etcd, cluster_name, "settings", "get", "--json")))["settings"]
    )


def test_settings_written_by_a_server_are_read_by_the_cli(
    etcd: EtcdServer, cluster_name: str
) -> None:
    async def write() -> None:
        async with EtcdClient.from_url(etcd.url) as client:
            await ClusterMetadata(client, cluster_name).set_setting("round", [1, 2])

    asyncio.run(write())
    got = json.loads(ok(run(etcd, cluster_name, "settings", "get", "round", "--json")))
    assert got["value"] == [1, 2]


def test_kv_and_settings_refuse_bad_input(etcd: EtcdServer, cluster_name: str) -> None:
    line = failed(run(etcd, cluster_name, "kv", "set", "k=v", "-s", "a/b"))
    assert "(BAD_CLUSTER_NAME)" in line
    line = failed(run(etcd, cluster_name, "kv", "set", "../k=v", "-s", "ns"))
    assert "(BAD_CLUSTER_NAME)" in line
    line = failed(run(etcd, cluster_name, "settings", "set", "a/b=1"))
    assert "(BAD_CLUSTER_NAME)" in line
    assert "KEY=VALUE" in failed(run(etcd, cluster_name, "settings", "set", "novalue"), status=2)
    assert "--coordinator" in failed(halfmoon("cluster", "kv", "list"), status=2)
    assert "--kv-namespace" in failed(run(etcd, cluster_name, "kv", "get", "k"), status=2)
    dead = f"etcd://127.0.0.1:{free_port()}"
    line = failed(halfmoon("cluster", "settings", "get", "--coordinator", dead, "--cluster", "c"))
    assert "(COORDINATOR_UNAVAILABLE)" in line
    # Nothing was written by the refused commands.
    assert json.loads(ok(run(etcd, cluster_name, "kv", "list", "--json"))) == {"kv": []}
    env = {"HALFMOON_COORDINATOR": etcd.url, "HALFMOON_CLUSTER": cluster_name}
    assert json.loads(ok(halfmoon("cluster", "settings", "get", "--json", env=env))) == {
        "settings": {}
    }
