"""Users and ACLs of cluster mode: one document in etcd, watched by every proxy.

The document is local mode's ``users.json`` (secret keys sealed with the key
of ``auth.key_file``, which every proxy of a cluster holds a copy of; etcd
and its backups never see a plain secret), kept under one key::

    /halfmoon/<cluster>/auth/document

Why one key: users and ACLs change rarely and are read on every request, so
each proxy holds all of them in memory; one key makes every change one
compare-and-swap (no change is lost to a concurrent one, none is half
applied), and the watch delivers whole documents in revision order.

- **Reads** come from memory, as in local mode (:class:`AuthStore`'s).
- **Writes** (any proxy's admin API, hence ``halfmoon user|acl``) apply the
  change to a copy of the last document this proxy holds, then write it with
  ``mod_revision`` compared to that document's; when another proxy wrote in
  between, the failed compare reads the current document and the change is
  tried again on it (a create of a user that now exists fails as it would
  locally). On success the proxy adopts its own write at once, so the next
  request through it sees the change.
- **The follower** (:meth:`EtcdAuthStore.follow`) lists the key, then
  watches it; every other proxy adopts a change within etcd's watch latency
  (milliseconds on a LAN). While etcd is away the last document keeps
  answering (a proxy does not lock everyone out because etcd restarts), and
  the follower re-lists when it is back.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from halfmoon import environment
from halfmoon.auth import AuthConfig, Guard, bootstrap_user
from halfmoon.auth.errors import AuthStoreCorrupt, Unauthenticated
from halfmoon.auth.policy import PolicyEntry, Resource, User
from halfmoon.auth.sealing import SecretBox
from halfmoon.auth.store import AuthStore
from halfmoon.cluster.coordination.etcd import (
    Compare,
    EtcdClient,
    KeyValue,
    WatchBatch,
    get_op,
    put_op,
)
from halfmoon.cluster.coordination.etcd_json import b64, call_sync, header_revision, key_value
from halfmoon.cluster.coordination.etcd_tls import EtcdTls
from halfmoon.cluster.coordination.follow import follow_prefix
from halfmoon.cluster.coordination.keys import ClusterKeys
from halfmoon.cluster.errors import CoordinatorUnavailable
from halfmoon.config import ConfigError

log = logging.getLogger("halfmoon.cluster.auth")

# A change retried this many times against concurrent writers before giving up.
MAX_ATTEMPTS = 20
T = TypeVar("T")


def document_key(cluster: str) -> str:
    return f"{ClusterKeys(cluster).prefix}auth/document"


class _Scratch(AuthStore):
    """A copy of the document that a change is applied to before it is written to etcd."""

    def _save(self) -> None:
        pass


class EtcdAuthStore(AuthStore):
    def __init__(
        self,
        endpoints: Sequence[str],
        cluster: str,
        box: SecretBox,
        *,
        timeout_s: float = 5.0,
        max_stale: float | None = None,
        tls: EtcdTls,
    ) -> None:
        super().__init__(None, box)
        self.tls = tls
        # auth.max_stale: how long without word from etcd before every request is refused.
        self.max_stale = max_stale
        self._heard = time.monotonic()
        self.endpoints = tuple(endpoints)
        self.key = document_key(cluster)
        self.timeout_s = timeout_s
        # The document as stored (sealed) and its mod_revision (0: no document yet), the
        # base of the next compare-and-swap; the highest etcd revision applied.
        self._stored: dict[str, Any] = {}
        self._revision = 0
        self._seen = 0
        self._writer = threading.Lock()  # one change at a time from this process
        self.changed = threading.Condition()  # notified on each adopted document

    # -- loading ---------------------------------------------------------------

    def load(self) -> None:
        """Read the document now (before serving); AuthStoreCorrupt when it does not
        unseal with this proxy's key, CoordinatorUnavailable when etcd does not answer."""
        answer = call_sync(
            self.endpoints, "/kv/range", {"key": b64(self.key)}, self.timeout_s, tls=self.tls
        )
        kvs = [key_value(kv) for kv in answer.get("kvs", [])]
        if kvs:
            self._offer(kvs[0].value, kvs[0].mod_revision, header_revision(answer), strict=True)
        else:
            self._offer(None, 0, header_revision(answer), strict=True)

    def _offer(self, raw: bytes | None, revision: int, seen: int, *, strict: bool = False) -> bool:
        """Adopt the document ``raw`` (None: deleted) stored at ``revision`` unless this
        store has seen a later one. A document that does not unseal is refused (and
        raised when ``strict``): the last good one keeps answering."""
        try:
            document = json.loads(raw) if raw is not None else {}
            if not isinstance(document, dict):
                raise AuthStoreCorrupt(f"the users document at {self.key} is not an object")
            with self._lock:
                if seen <= self._seen and self._seen:
                    return False
                self._adopt(document, f"etcd key {self.key}")
                self._stored, self._revision, self._seen = document, revision, seen
        except (ValueError, AuthStoreCorrupt) as exc:
            if strict:
                raise AuthStoreCorrupt(
                    f"the users document at {self.key} does not load: {exc} (is auth.key_file "
                    "the key the other proxies of this cluster use?)"
                ) from None
            log.error("event=auth_document_refused key=%s error=%s", self.key, exc)
            return False
        with self.changed:
            self.changed.notify_all()
        log.info("event=auth_document_adopted revision=%d users=%d", revision, len(self._users))
        return True

    def check_fresh(self) -> None:
        if self.max_stale is None:
            return
        silent = time.monotonic() - self._heard
        if silent > self.max_stale:
            raise Unauthenticated(
                f"this proxy has not heard from etcd for {silent:.0f} s (auth.max_stale "
                f"{self.max_stale:g} s): users and ACLs cannot be checked; try another proxy"
            )

    def wait_for_revision(self, revision: int, timeout: float) -> bool:
        """Wait until a document at ``revision`` or later is adopted (tests, tools)."""
        with self.changed:
            return self.changed.wait_for(lambda: self._seen >= revision, timeout)

    # -- following -------------------------------------------------------------

    async def follow(self, client: EtcdClient) -> None:
        """List the document, watch it, adopt each change; forever (cancel to stop)."""
        await follow_prefix(
            client,
            self.key,
            what="auth",
            listed=self._listed,
            changed=self._changed_batch,
            heard=self._note_heard,
        )

    def _note_heard(self) -> None:
        self._heard = time.monotonic()

    async def _listed(self, kvs: list[KeyValue], revision: int) -> None:
        found = [kv for kv in kvs if kv.key == self.key]
        if found:
            self._offer(found[0].value, found[0].mod_revision, revision)
        else:
            self._offer(None, 0, revision)

    async def _changed_batch(self, batch: WatchBatch) -> None:
        for event in batch.events:
            if event.kv.key != self.key:
                continue
            raw = None if event.kind == "DELETE" else event.kv.value
            stored_at = 0 if event.kind == "DELETE" else event.kv.mod_revision
            self._offer(raw, stored_at, event.kv.mod_revision)

    # -- changes ---------------------------------------------------------------

    def _change(self, apply: Callable[[AuthStore], T]) -> T:
        """Apply ``apply`` to a copy of the stored document and compare-and-swap it in."""
        with self._writer:
            for _ in range(MAX_ATTEMPTS):
                with self._lock:
                    base, base_revision = self._stored, self._revision
                scratch = _Scratch(None, self._box)
                scratch._adopt(base, f"etcd key {self.key}")
                result = apply(scratch)  # validation errors (UserExists, ...) raise here
                raw = json.dumps(scratch._document(), sort_keys=True).encode()
                answer = call_sync(
                    self.endpoints,
                    "/kv/txn",
                    {
                        "compare": [Compare(self.key, "MOD", base_revision).json()],
                        "success": [put_op(self.key, raw)],
                        "failure": [get_op(self.key)],
                    },
                    self.timeout_s,
                    tls=self.tls,
                )
                revision = header_revision(answer)
                if answer.get("succeeded"):
                    self._offer(raw, revision, revision, strict=True)
                    log.info("event=auth_document_written revision=%d", revision)
                    return result
                # Another proxy wrote first: take its document and try the change on it.
                current = [
                    key_value(kv)
                    for response in answer.get("responses", [])
                    for kv in response.get("response_range", {}).get("kvs", [])
                ]
                if current:
                    self._offer(current[0].value, current[0].mod_revision, revision, strict=True)
                else:
                    self._offer(None, 0, revision, strict=True)
        raise CoordinatorUnavailable(
            f"the users document changed under {MAX_ATTEMPTS} attempts in a row; try again"
        )

    def create_user(
        self, access_key: str, secret_key: str, user_type: str = "Normal", enabled: bool = True
    ) -> User:
        return self._change(lambda s: s.create_user(access_key, secret_key, user_type, enabled))

    def update_user(
        self,
        access_key: str,
        *,
        secret_key: str | None = None,
        user_type: str | None = None,
        enabled: bool | None = None,
    ) -> User:
        return self._change(
            lambda s: s.update_user(
                access_key, secret_key=secret_key, user_type=user_type, enabled=enabled
            )
        )

    def delete_user(self, access_key: str) -> None:
        self._change(lambda s: s.delete_user(access_key))

    def create_acl(self, subject: object, documents: Any) -> list[PolicyEntry]:
        documents = list(documents)
        return self._change(lambda s: s.create_acl(subject, documents))

    def update_acl(self, subject: object, documents: Any) -> list[PolicyEntry]:
        documents = list(documents)
        return self._change(lambda s: s.update_acl(subject, documents))

    def delete_acl(self, subject: object, resource: Resource | None = None) -> None:
        self._change(lambda s: s.delete_acl(subject, resource))


def cluster_guard(
    config: AuthConfig, endpoints: Sequence[str], cluster: str, tls: EtcdTls
) -> Guard | None:
    """The guard of a cluster proxy (users and ACLs in etcd), loaded; None when there is
    no key to unseal them (authentication off and no ``auth.key_file``: no users kept)."""
    if config.key_file is None:
        if not config.enabled:
            return None
        raise ConfigError(
            "auth.enabled on a cluster proxy needs auth.key_file: the key that seals the "
            "secret keys stored in etcd, the same file on every proxy of the cluster "
            "(create one with: openssl rand -hex 32 > auth.key; chmod 600 auth.key)"
        )
    box = SecretBox.from_file(config.key_file, create=False)
    store = EtcdAuthStore(endpoints, cluster, box, max_stale=config.max_stale, tls=tls)
    store.load()
    bootstrap_user(store, config, environment.BOOTSTRAP_SECRET_KEY.get())
    return Guard(config, store)
