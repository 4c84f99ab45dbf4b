"""Users and ACLs in etcd against a real etcd: propagation, concurrent writers, sealing."""

from __future__ import annotations

import asyncio
import secrets
import threading
from pathlib import Path

import pytest

from halfmoon.auth import AuthConfig, Guard, Resource, Unauthenticated
from halfmoon.auth.errors import AuthStoreCorrupt, UserExists
from halfmoon.auth.sealing import SecretBox
from halfmoon.cluster.coordination.auth_store import EtcdAuthStore, cluster_guard, document_key
from halfmoon.cluster.coordination.etcd import EtcdClient
from halfmoon.cluster.coordination.etcd_json import b64, call_sync, key_value, parse_coordinator
from halfmoon.cluster.coordination.etcd_tls import PLAIN
from halfmoon.config import ConfigError
from tests.cluster.etcd_server import EtcdServer
from tests.waiting import time_until

PROPAGATION_BOUND_S = 1.0
KEY = SecretBox(bytes(range(32)))


def store(etcd: EtcdServer, cluster: str, box: SecretBox = KEY) -> EtcdAuthStore:
    s = EtcdAuthStore(parse_coordinator(etcd.url), cluster, box, tls=PLAIN)
    s.load()
    return s


class Follower:
    """``store.follow`` on an event loop of its own thread, as a proxy runs it."""

    def __init__(self, etcd: EtcdServer, s: EtcdAuthStore) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = EtcdClient.from_url(etcd.url)
        self.task: asyncio.Task[None] | None = None
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.task = self.loop.create_task(s.follow(self.client))
            self.loop.call_soon(started.set)
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        started.wait(5)

    def stop(self) -> None:
        async def end() -> None:
            assert self.task is not None
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            await self.client.close()
            self.loop.stop()

        asyncio.run_coroutine_threadsafe(end(), self.loop)
        self.thread.join(10)


def test_a_user_and_an_acl_made_on_one_proxy_apply_on_another_within_a_second(
    etcd: EtcdServer, cluster_name: str
) -> None:
    a, b = store(etcd, cluster_name), store(etcd, cluster_name)
    followers = [Follower(etcd, a), Follower(etcd, b)]
    try:
        a.create_user("alice", "alice-secret-key")
        assert a.user("alice") is not None  # read-your-writes on the writer, at once
        took = time_until(lambda: b.user("alice") is not None, PROPAGATION_BOUND_S, "the user")
        assert b.user("alice").secret_key == "alice-secret-key"  # type: ignore[union-attr]
        a.create_acl("User:alice", [{"resource": "Topic:orders-*", "actions": ["Pub"]}])
        time_until(lambda: b.entries("alice"), PROPAGATION_BOUND_S, "the ACL")
        a.update_acl("User:alice", [{"resource": "Topic:orders-*", "actions": ["Sub"]}])
        time_until(
            lambda: [e.to_dict()["actions"] for e in b.entries("alice")] == [["Sub"]],
            PROPAGATION_BOUND_S,
            "the changed ACL",
        )
        b.delete_acl("User:alice", Resource("Topic", "orders-*"))  # and the other way round
        time_until(lambda: a.entries("alice") == [], PROPAGATION_BOUND_S, "the deletion on a")
        a.update_user("alice", enabled=False)
        time_until(
            lambda: not b.user("alice").enabled,  # type: ignore[union-attr]
            PROPAGATION_BOUND_S,
            "the disabled user",
        )
        print(f"user propagation: {took * 1000:.1f} ms")
    finally:
        for follower in followers:
            follower.stop()


def test_concurrent_changes_through_two_proxies_are_all_kept(
    etcd: EtcdServer, cluster_name: str
) -> None:
    a, b = store(etcd, cluster_name), store(etcd, cluster_name)
    errors: list[BaseException] = []

    def create(s: EtcdAuthStore, prefix: str) -> None:
        try:
            for i in range(10):
                s.create_user(f"{prefix}{i}", f"{prefix}-secret-{i}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(s, p)) for s, p in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(store(etcd, cluster_name).users()) == 20
    with pytest.raises(UserExists):  # b has not seen a0 by a watch: the compare tells it
        b.create_user("a0", "another-secret")


def test_etcd_holds_sealed_secrets_and_a_wrong_key_is_refused(
    etcd: EtcdServer, cluster_name: str
) -> None:
    secret = "plain-" + secrets.token_hex(8)
    store(etcd, cluster_name).create_user("bob", secret)
    answer = call_sync(
        parse_coordinator(etcd.url),
        "/kv/range",
        {"key": b64(document_key(cluster_name))},
        tls=PLAIN,
    )
    raw = key_value(answer["kvs"][0]).value
    assert b"bob" in raw and secret.encode() not in raw
    with pytest.raises(AuthStoreCorrupt, match="auth.key_file"):
        store(etcd, cluster_name, SecretBox(bytes(32)))


def test_a_proxy_with_authentication_on_needs_the_shared_key_file(
    etcd: EtcdServer, cluster_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoints = parse_coordinator(etcd.url)
    with pytest.raises(ConfigError, match="auth.key_file"):
        cluster_guard(AuthConfig(enabled=True), endpoints, cluster_name, tls=PLAIN)
    assert cluster_guard(AuthConfig(enabled=False), endpoints, cluster_name, tls=PLAIN) is None
    key = tmp_path / "auth.key"
    key.write_text(secrets.token_hex(32))
    monkeypatch.setenv("HALFMOON_BOOTSTRAP_SECRET_KEY", "root-secret-key")
    config = AuthConfig(enabled=True, key_file=key, bootstrap_access_key="root")
    guards = [
        cluster_guard(config, endpoints, cluster_name, tls=PLAIN) for _ in range(2)
    ]  # two proxies
    for guard in guards:
        assert guard is not None
        root = guard.store.user("root")
        assert root is not None and root.is_super
    assert len(guards[1].store.users()) == 1  # type: ignore[union-attr]


def test_a_follower_survives_an_etcd_restart_and_sees_changes_made_meanwhile(
    own_etcd: EtcdServer,
) -> None:
    a, b = store(own_etcd, "restarts"), store(own_etcd, "restarts")
    follower = Follower(own_etcd, b)
    try:
        a.create_user("before", "before-secret")
        time_until(lambda: b.user("before") is not None, PROPAGATION_BOUND_S, "the first user")
        own_etcd.kill()
        # etcd away: b keeps answering with what it holds (no one is locked out) ...
        assert b.user("before") is not None
        own_etcd.restart()
        a.create_user("after", "after-secret")  # ... and catches up once etcd is back
        time_until(lambda: b.user("after") is not None, 15, "the user made after the restart")
    finally:
        follower.stop()


def test_a_document_that_does_not_unseal_is_refused_and_the_last_good_one_kept(
    etcd: EtcdServer, cluster_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    endpoints = parse_coordinator(etcd.url)
    a, b = store(etcd, cluster_name), store(etcd, cluster_name)
    follower = Follower(etcd, b)
    try:
        a.create_user("kept", "kept-secret-key")
        time_until(lambda: b.user("kept") is not None, PROPAGATION_BOUND_S, "the user")
        # Someone with etcd access puts a document sealed with another key in its place.
        forger = EtcdAuthStore(
            endpoints, f"forged-{cluster_name[:40]}", SecretBox(b"k" * 32), tls=PLAIN
        )
        forger.create_user("mallory", "mallory-secret")
        forged = call_sync(endpoints, "/kv/range", {"key": b64(forger.key)}, tls=PLAIN)["kvs"][0][
            "value"
        ]
        with caplog.at_level("ERROR", logger="halfmoon.cluster.auth"):
            call_sync(endpoints, "/kv/put", {"key": b64(a.key), "value": forged}, tls=PLAIN)
            time_until(
                lambda: "auth_document_refused" in caplog.text, PROPAGATION_BOUND_S, "the refusal"
            )
        # b keeps exactly the last good users; a new proxy refuses to start on it.
        assert b.user("kept") is not None and b.user("mallory") is None
        with pytest.raises(AuthStoreCorrupt, match="auth.key_file"):
            store(etcd, cluster_name)
    finally:
        follower.stop()


def test_with_max_stale_a_proxy_cut_off_from_etcd_refuses_until_it_hears_again(
    own_etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    b = EtcdAuthStore(parse_coordinator(own_etcd.url), "stale", KEY, max_stale=1.0, tls=PLAIN)
    b.load()
    b.create_user("alice", "alice-secret-key")
    guard = Guard(AuthConfig(enabled=True, max_stale=1.0), b)
    header = "Bearer alice:alice-secret-key"
    follower = Follower(own_etcd, b)
    try:
        assert guard.authenticate_http(header, "10.0.0.1", "GET /v1/topics").access_key == "alice"
        own_etcd.pause()  # a hung etcd (or a cut network): nothing answers

        def refused() -> bool:
            try:
                guard.authenticate_http(header, "10.0.0.1", "GET /v1/topics")
            except Unauthenticated as exc:
                assert "auth.max_stale" in exc.message
                return True
            return False

        time_until(refused, 10, "the refusal once etcd is silent")
        assert "event=access_denied reason=unauthenticated" in caplog.text
        own_etcd.resume()
        time_until(lambda: not refused(), 15, "the proxy serving again once etcd answers")
    finally:
        own_etcd.resume()
        follower.stop()


def test_the_last_super_user_stays_and_a_locked_out_cluster_recovers_by_bootstrap(
    etcd: EtcdServer, cluster_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from halfmoon.auth.errors import LastSuperUser

    a, b = store(etcd, cluster_name), store(etcd, cluster_name)
    a.create_user("root", "root-secret-key", "Super")
    a.create_user("ops", "ops-secret-key", "Super")
    b.load()
    a.update_user("ops", enabled=False)  # fine: root remains
    # b has not seen that change: its write retries on the stored document and is refused.
    for change in (
        lambda: b.delete_user("root"),
        lambda: b.update_user("root", enabled=False),
        lambda: b.update_user("root", user_type="Normal"),
    ):
        with pytest.raises(LastSuperUser) as refused:
            change()
        assert refused.value.code == "LAST_SUPER_USER"
    assert store(etcd, cluster_name).user("root").enabled  # type: ignore[union-attr]

    # The secret of the last super user is lost: a proxy started with bootstrap_recover
    # makes the bootstrap user an enabled super user with the new secret, in etcd.
    key = tmp_path / "auth.key"
    key.write_text(bytes(range(32)).hex())  # KEY's, as a proxy's auth.key_file
    monkeypatch.setenv("HALFMOON_BOOTSTRAP_SECRET_KEY", "new-ops-secret-key")
    config = AuthConfig(
        enabled=True, key_file=key, bootstrap_access_key="ops", bootstrap_recover=True
    )
    guard = cluster_guard(config, parse_coordinator(etcd.url), cluster_name, tls=PLAIN)
    assert guard is not None
    ops = store(etcd, cluster_name).user("ops")
    assert ops is not None and ops.enabled and ops.is_super
    assert ops.secret_key == "new-ops-secret-key"
    monkeypatch.delenv("HALFMOON_BOOTSTRAP_SECRET_KEY")
    with pytest.raises(ConfigError, match="bootstrap_recover"):
        cluster_guard(config, parse_coordinator(etcd.url), cluster_name, tls=PLAIN)
