"""The cluster's key layout in etcd: one prefix per cluster, one key per object.

::

    /halfmoon/<cluster>/brokers/<name>     a live broker (under its lease): endpoint, facts
    /halfmoon/<cluster>/proxies/<id>       a live proxy (under its lease)
    /halfmoon/<cluster>/topics/<name>      a topic: its queues' placement, type, perm
    /halfmoon/<cluster>/groups/<name>      a consumer group's settings
    /halfmoon/<cluster>/settings/<key>     a runtime setting of the whole cluster
    /halfmoon/<cluster>/kv/<namespace>/<key>  the name server's KV config (mqadmin's
                                           updateKvConfig), a string per key

Values are JSON objects (a setting's value is any JSON value). Names are
checked before they become key segments, so no name can reach outside its
directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from halfmoon.cluster.errors import BadClusterName

ROOT = "/halfmoon/"
KINDS = ("brokers", "proxies", "topics", "groups", "settings")
MAX_NAME_LENGTH = 64
# Cluster, broker, proxy and setting names: what a host name or a config key looks like.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# KV config keys are often topic names (ORDER_TOPIC_CONFIG's are), so they may hold '%'
# (a namespaced topic) and ':' as well; never '/', which would reach another namespace.
_KV_KEY = re.compile(r"^[A-Za-z0-9%][A-Za-z0-9%_.:-]*$")
MAX_KV_KEY_LENGTH = 255


def check_name(what: str, name: str) -> str:
    if (
        not isinstance(name, str)
        or not name
        or len(name) > MAX_NAME_LENGTH
        or not _NAME.match(name)
    ):
        raise BadClusterName(
            f"illegal {what} name {name!r}: use 1 to {MAX_NAME_LENGTH} letters, digits, '_', "
            "'.' or '-', starting with a letter or digit"
        )
    return name


def check_kv_key(key: str) -> str:
    if (
        not isinstance(key, str)
        or not key
        or len(key) > MAX_KV_KEY_LENGTH
        or not _KV_KEY.match(key)
    ):
        raise BadClusterName(
            f"illegal KV config key {key!r}: use 1 to {MAX_KV_KEY_LENGTH} letters, digits, "
            "'%', '_', '.', ':' or '-', starting with a letter, digit or '%'"
        )
    return key


@dataclass(frozen=True)
class ClusterKeys:
    """The keys of one cluster."""

    cluster: str

    def __post_init__(self) -> None:
        check_name("cluster", self.cluster)

    @property
    def prefix(self) -> str:
        return f"{ROOT}{self.cluster}/"

    def kind_prefix(self, kind: str) -> str:
        assert kind in KINDS, kind
        return f"{self.prefix}{kind}/"

    def broker(self, name: str) -> str:
        return self.kind_prefix("brokers") + check_name("broker", name)

    def proxy(self, proxy_id: str) -> str:
        return self.kind_prefix("proxies") + check_name("proxy", proxy_id)

    def topic(self, name: str) -> str:
        # Topic names are checked by the caller with the broker's own rule (it allows '%').
        return self.kind_prefix("topics") + name

    def group(self, name: str) -> str:
        return self.kind_prefix("groups") + name

    def setting(self, key: str) -> str:
        return self.kind_prefix("settings") + check_name("setting", key)

    def kv_prefix(self, namespace: str | None = None) -> str:
        """Where the KV config lives: all of it, or one namespace's keys."""
        base = f"{self.prefix}kv/"
        return base if namespace is None else f"{base}{check_name('KV namespace', namespace)}/"

    def kv(self, namespace: str, key: str) -> str:
        return self.kv_prefix(namespace) + check_kv_key(key)

    def split_kv(self, key: str) -> tuple[str, str] | None:
        """``(namespace, key)`` of a KV config key of this cluster, None for anything else."""
        rest = key.removeprefix(self.kv_prefix())
        namespace, sep, name = rest.partition("/")
        if rest == key or not sep or not namespace or not name or "/" in name:
            return None
        return namespace, name

    def split(self, key: str) -> tuple[str, str] | None:
        """``(kind, name)`` of a key of this cluster, None for anything else."""
        if not key.startswith(self.prefix):
            return None
        kind, sep, name = key[len(self.prefix) :].partition("/")
        if not sep or kind not in KINDS or not name or "/" in name:
            return None
        return kind, name
