"""Users and ACLs on disk: secrets sealed at rest, survive a reopen, refuse a wrong key."""

from __future__ import annotations

import pytest

from halfmoon.auth.errors import AclExists, AuthStoreCorrupt, UserExists, UserNotFound
from halfmoon.auth.policy import Resource
from halfmoon.auth.sealing import SecretBox
from halfmoon.auth.store import AuthStore


def open_store(tmp_path, key="key"):
    return AuthStore(tmp_path / "users.json", SecretBox.from_file(tmp_path / key))


def test_users_survive_reopen_and_secrets_are_not_stored_plain(tmp_path):
    store = open_store(tmp_path)
    store.create_user("alice", "very-secret-key-1")
    store.create_acl("User:alice", [{"resource": "Topic:t", "actions": ["Pub"]}])
    assert b"very-secret-key-1" not in (tmp_path / "users.json").read_bytes()
    assert (tmp_path / "key").stat().st_mode & 0o077 == 0
    again = open_store(tmp_path)
    assert again.user("alice").secret_key == "very-secret-key-1"
    assert [str(e.resource) for e in again.entries("alice")] == ["Topic:t"]


def test_wrong_key_refuses_to_open(tmp_path):
    open_store(tmp_path).create_user("alice", "very-secret-key-1")
    with pytest.raises(AuthStoreCorrupt):
        open_store(tmp_path, key="other-key")


def test_user_and_acl_lifecycle_errors(tmp_path):
    store = open_store(tmp_path)
    store.create_user("alice", "very-secret-key-1")
    with pytest.raises(UserExists):
        store.create_user("alice", "very-secret-key-2")
    with pytest.raises(UserNotFound):
        store.create_acl("User:bob", [{"resource": "Topic:t", "actions": ["Pub"]}])
    store.create_acl("User:alice", [{"resource": "Topic:t", "actions": ["Pub"]}])
    with pytest.raises(AclExists):
        store.create_acl("User:alice", [{"resource": "Topic:t", "actions": ["Sub"]}])
    store.update_acl("User:alice", [{"resource": "Topic:t", "actions": ["Sub"]}])
    assert store.entries("alice")[0].actions == {"Sub"}
    store.update_user("alice", enabled=False)
    assert not open_store(tmp_path).user("alice").enabled
    store.delete_acl("User:alice", Resource("Topic", "t"))
    assert store.entries("alice") == []
    store.delete_user("alice")
    assert store.user("alice") is None


def test_sealed_value_tampering_is_detected(tmp_path):
    box = SecretBox.from_file(tmp_path / "key")
    sealed = box.seal("hello-secret")
    assert box.open(sealed) == "hello-secret"
    flipped = sealed[:-6] + ("A" if sealed[-6] != "A" else "B") + sealed[-5:]
    with pytest.raises(AuthStoreCorrupt):
        box.open(flipped)


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.delete_user("root"),
        lambda s: s.update_user("root", enabled=False),
        lambda s: s.update_user("root", user_type="Normal"),
    ],
    ids=["delete", "disable", "demote"],
)
def test_the_last_enabled_super_user_cannot_be_removed(tmp_path, change):
    from halfmoon.auth.errors import LastSuperUser

    store = open_store(tmp_path)
    store.create_user("root", "root-secret-key", "Super")
    store.create_user("ops", "ops-secret-key", "Super", enabled=False)  # does not count
    store.create_user("alice", "alice-secret-key")
    with pytest.raises(LastSuperUser) as refused:
        change(store)
    assert refused.value.code == "LAST_SUPER_USER" and "'root'" in refused.value.message
    assert open_store(tmp_path).user("root").enabled  # nothing was written
    assert open_store(tmp_path).user("root").is_super
    store.update_user("ops", enabled=True)  # a second one: now root may go
    change(store)
    with pytest.raises(LastSuperUser):
        store.delete_user("ops")
    store.update_user("alice", enabled=False)  # normal users are never held back
    store.delete_user("alice")
