"""Users and ACLs in etcd against a real etcd: propagation, concurrent writers, sealing."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from pathlib import Path

import pytest

from halfmoon.auth import AuthConfig, Guard, Resource, Unauthenticated
from halfmoon.auth.errors import AuthStoreCorrupt, UserExists
from halfmoon.auth.sealing import SecretBox
from halfmoon.cluster.auth_store import EtcdAuthStore, cluster_guard, document_key
from halfmoon.cluster.etcd import EtcdClient
from halfmoon.cluster.etcd_json import b64, call_sync, key_value, parse_coordinator
from halfmoon.config import ConfigError
from tests.cluster.etcd_server import EtcdServer

PROPAGATION_BOUND_S = 1.0
KEY = SecretBox(bytes(range(32)))


def store(etcd: EtcdServer, cluster: str, box: SecretBox = KEY) -> EtcdAuthStore:
    s = EtcdAuthStore(parse_coordinator(etcd.url), cluster, box)
    s.load()
    return s


def wait_until(condition, timeout: float, what: str) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)
    return time.monotonic() - started


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
        took = wait_until(lambda: b.user("alice") is not None, PROPAGATION_BOUND_S, "the user")
        assert b.user("alice").secret_key == "alice-secret-key"  # type: ignore[union-attr]
        a.create_acl("User:alice", [{"resource": "Topic:orders-*", "actions": ["Pub"]}])
        wait_until(lambda: b.entries("alice"), PROPAGATION_BOUND_S, "the ACL")
        a.update_acl("User:alice", [{"resource": "Topic:orders-*", "actions": ["Sub"]}])
        wait_until(
            lambda: [e.to_dict()["actions"] for e in b.entries("alice")] == [["Sub"]],
            PROPAGATION_BOUND_S,
            "the changed ACL",
        )
        b.delete_acl("User:alice", Resource("Topic", "orders-*"))  # and the other way round
        wait_until(lambda: a.entries("alice") == [], PROPAGATION_BOUND_S, "the deletion on a")
        a.update_user("alice", enabled=False)
        wait_until(
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
        parse_coordinator(etcd.url), "/kv/range", {"key": b64(document_key(cluster_name))}
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
        cluster_guard(AuthConfig(enabled=True), endpoints, cluster_name)
    assert cluster_guard(AuthConfig(enabled=False), endpoints, cluster_name) is None
    key = tmp_path / "auth.key"
    key.write_text(secrets.token_hex(32))
    monkeypatch.setenv("HALFMOON_BOOTSTRAP_SECRET_KEY", "root-secret-key")
    config = AuthConfig(enabled=True, key_file=key, bootstrap_access_key="root")
    guards = [cluster_guard(config, endpoints, cluster_name) for _ in range(2)]  # two proxies
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
        wait_until(lambda: b.user("before") is not None, PROPAGATION_BOUND_S, "the first user")
        own_etcd.kill()
        # etcd away: b keeps answering with what it holds (no one is locked out) ...
        assert b.user("before") is not None
        own_etcd.restart()
        a.create_user("after", "after-secret")  # ... and catches up once etcd is back
        wait_until(lambda: b.user("after") is not None, 15, "the user made after the restart")
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
        wait_until(lambda: b.user("kept") is not None, PROPAGATION_BOUND_S, "the user")
        # Someone with etcd access puts a document sealed with another key in its place.
        forger = EtcdAuthStore(endpoints, f"forged-{cluster_name[:40]}", SecretBox(b"k" * 32))
        forger.create_user("mallory", "mallory-secret")
        forged = call_sync(endpoints, "/kv/range", {"key": b64(forger.key)})["kvs"][0]["value"]
        with caplog.at_level("ERROR", logger="halfmoon.cluster.auth"):
            call_sync(endpoints, "/kv/put", {"key": b64(a.key), "value": forged})
            wait_until(
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
    b = EtcdAuthStore(parse_coordinator(own_etcd.url), "stale", KEY, max_stale=1.0)
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

        wait_until(refused, 10, "the refusal once etcd is silent")
        assert "event=access_denied reason=unauthenticated" in caplog.text
        own_etcd.resume()
        wait_until(lambda: not refused(), 15, "the proxy serving again once etcd answers")
    finally:
        own_etcd.resume()
        follower.stop()
