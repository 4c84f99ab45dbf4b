"""The cluster's KV config and runtime settings in etcd, read and written by the CLI.

Standard library only (the etcd JSON gateway through urllib), so ``halfmoon
cluster kv|settings`` start as fast as the rest of the command line and need
no broker or proxy running: the name server's config lives in etcd, not in a
process.

- **KV config** (RocketMQ's ``updateKvConfig`` / ``deleteKvConfig`` /
  ``updateOrderConf``): string values under ``namespace/key``, kept for tools
  that read them. halfmoon's own processes read none of them.
- **Settings** (``getNamesrvConfig`` / ``updateNamesrvConfig``): JSON values
  under ``settings/<key>``, which every broker and proxy holds in its watched
  view (:mod:`halfmoon.cluster.coordination.view`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from halfmoon.cluster.coordination.etcd_json import b64, call_sync, key_value, range_prefix_sync
from halfmoon.cluster.coordination.etcd_tls import EtcdTls
from halfmoon.cluster.coordination.keys import ClusterKeys
from halfmoon.cluster.errors import ClusterKeyNotFound

# RocketMQ 4's per-topic order configuration is this KV namespace ("broker-a:4;broker-b:4").
ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


class ClusterConfig:
    def __init__(self, endpoints: Sequence[str], cluster: str, *, tls: EtcdTls) -> None:
        self.endpoints = tuple(endpoints)
        self.tls = tls
        self.keys = ClusterKeys(cluster)

    # KV config -----------------------------------------------------------------------

    def kv_list(self, namespace: str | None = None) -> list[dict[str, str]]:
        """Every KV entry (of one namespace), sorted by namespace and key."""
        kvs, _ = range_prefix_sync(self.endpoints, self.keys.kv_prefix(namespace), tls=self.tls)
        entries = []
        for kv in kvs:
            split = self.keys.split_kv(kv.key)
            if split is not None:
                entries.append({"namespace": split[0], "key": split[1], "value": kv.value.decode()})
        return entries

    def kv_get(self, namespace: str, key: str) -> str:
        found = self._get(self.keys.kv(namespace, key))
        if found is None:
            raise ClusterKeyNotFound(
                f"no KV config {namespace}/{key} in cluster {self.keys.cluster!r}"
            )
        return found.decode()

    def kv_set(self, namespace: str, key: str, value: str) -> None:
        self._put(self.keys.kv(namespace, key), value.encode())

    def kv_delete(self, namespace: str, key: str) -> bool:
        return self._delete(self.keys.kv(namespace, key))

    # Settings ------------------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        kvs, _ = range_prefix_sync(self.endpoints, self.keys.kind_prefix("settings"), tls=self.tls)
        found = {}
        for kv in kvs:
            split = self.keys.split(kv.key)
            if split is not None:
                found[split[1]] = json.loads(kv.value)
        return found

    def setting(self, key: str) -> Any:
        found = self._get(self.keys.setting(key))
        if found is None:
            raise ClusterKeyNotFound(f"no setting {key!r} in cluster {self.keys.cluster!r}")
        return json.loads(found)

    def set_setting(self, key: str, value: Any) -> None:
        # The encoding ClusterMetadata.set_setting writes, so both read each other's values.
        raw = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
        self._put(self.keys.setting(key), raw)

    def delete_setting(self, key: str) -> bool:
        return self._delete(self.keys.setting(key))

    # etcd ----------------------------------------------------------------------------

    def _get(self, key: str) -> bytes | None:
        kvs = call_sync(self.endpoints, "/kv/range", {"key": b64(key)}, tls=self.tls).get("kvs", [])
        return key_value(kvs[0]).value if kvs else None

    def _put(self, key: str, value: bytes) -> None:
        call_sync(self.endpoints, "/kv/put", {"key": b64(key), "value": b64(value)}, tls=self.tls)

    def _delete(self, key: str) -> bool:
        answer = call_sync(self.endpoints, "/kv/deleterange", {"key": b64(key)}, tls=self.tls)
        return int(answer.get("deleted", 0)) > 0
