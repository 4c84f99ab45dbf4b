"""Users and ACLs, kept in the data directory in local mode (``auth/users.json``).

Cluster mode keeps the same document in etcd
(:class:`halfmoon.cluster.coordination.auth_store.EtcdAuthStore`, a subclass).

One JSON document holds every user (secret keys sealed, see
:mod:`halfmoon.auth.sealing`) and every ACL (a subject ``User:<ak>`` with its
policy entries). It is small and changes rarely, so each change rewrites it
whole: a temporary file, fsync, rename, fsync of the directory; a crash
leaves the old or the new document, never half of one. Reads come from
memory (every RPC authenticates), under a lock shared with the writers.

ACL operations follow mqadmin's: ``create`` adds entries for a subject whose
resources it does not cover yet, ``update`` replaces (or adds) the entries
for the resources it names, ``delete`` removes a subject's entries (all, or
those of one resource), ``get``/``list`` read them.

The last enabled super user cannot be deleted, disabled or made a normal user
(:class:`LastSuperUser`): nobody could manage users and ACLs afterwards. The
rule lives here, so the admin API, the CLI and the dashboard (all through the
API) refuse alike, locally and in cluster mode (each change is applied to the
etcd document under compare-and-swap). An operator who lost the last one's
secret recovers with ``halfmoon user recover`` (docs/security.md).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from halfmoon.auth.errors import (
    AclExists,
    AclNotFound,
    AuthStoreCorrupt,
    IllegalPolicy,
    LastSuperUser,
    UserExists,
    UserNotFound,
)
from halfmoon.auth.policy import (
    PolicyEntry,
    Resource,
    User,
    check_access_key,
    check_secret_key,
    check_user_type,
    entry_from_dict,
)
from halfmoon.auth.sealing import SecretBox

SUBJECT_PREFIX = "User:"


def subject_user(subject: object) -> str:
    """``User:<ak>`` (or a bare access key) → the access key."""
    if not isinstance(subject, str):
        raise IllegalPolicy("subject must be User:ACCESS_KEY")
    return check_access_key(subject.removeprefix(SUBJECT_PREFIX))


def _manages(user: User) -> bool:
    """Whether ``user`` can manage users and ACLs (an enabled super user)."""
    return user.enabled and user.is_super


class AuthStore:
    def __init__(self, path: Path | None, box: SecretBox) -> None:
        # None: a subclass keeps the document elsewhere (cluster mode: etcd) and overrides
        # _save; the lock is held across each change and its _save, so no reader sees a
        # change that was not stored.
        self.path = path
        self._box = box
        self._lock = threading.Lock()
        self._users: dict[str, User] = {}
        self._acls: dict[str, list[PolicyEntry]] = {}
        if path is not None and path.exists():
            self._load()

    def _load(self) -> None:
        assert self.path is not None
        try:
            document = json.loads(self.path.read_text())
        except ValueError as exc:
            raise AuthStoreCorrupt(f"the users file {self.path} does not parse: {exc}") from None
        self._adopt(document, str(self.path))

    def _adopt(self, document: Any, where: str) -> None:
        """Replace the users and ACLs with those of ``document`` (as :meth:`_document` writes
        it); AuthStoreCorrupt, and nothing changed, when it does not parse or decrypt."""
        users: dict[str, User] = {}
        acls: dict[str, list[PolicyEntry]] = {}
        try:
            for ak, record in document.get("users", {}).items():
                users[ak] = User(
                    ak,
                    self._box.open(record["secret"]),
                    record.get("user_type", "Normal"),
                    bool(record.get("enabled", True)),
                )
            for ak, entries in document.get("acls", {}).items():
                acls[ak] = [entry_from_dict(e) for e in entries]
        except (ValueError, KeyError, TypeError, AttributeError, IllegalPolicy) as exc:
            raise AuthStoreCorrupt(f"the users of {where} do not parse: {exc}") from None
        self._users, self._acls = users, acls

    def _document(self) -> dict[str, Any]:
        """Every user (secret keys sealed) and every ACL, as one JSON document."""
        return {
            "users": {
                ak: {
                    "secret": self._box.seal(u.secret_key),
                    "user_type": u.user_type,
                    "enabled": u.enabled,
                }
                for ak, u in sorted(self._users.items())
            },
            "acls": {
                ak: [e.to_dict() for e in entries] for ak, entries in sorted(self._acls.items())
            },
        }

    def _save(self) -> None:
        assert self.path is not None
        document = self._document()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(document, out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def check_fresh(self) -> None:
        """Raise Unauthenticated when the users held may be out of date (never, here: the
        file is the truth; cluster mode's store answers from a copy of etcd)."""

    # -- users ---------------------------------------------------------------

    def user(self, access_key: str) -> User | None:
        with self._lock:
            return self._users.get(access_key)

    def users(self) -> list[User]:
        with self._lock:
            return sorted(self._users.values(), key=lambda u: u.access_key)

    def create_user(
        self, access_key: str, secret_key: str, user_type: str = "Normal", enabled: bool = True
    ) -> User:
        user = User(
            check_access_key(access_key),
            check_secret_key(secret_key),
            check_user_type(user_type),
            bool(enabled),
        )
        with self._lock:
            if access_key in self._users:
                raise UserExists(f"user {access_key!r} already exists; use update to change it")
            self._users[access_key] = user
            self._save()
        return user

    def update_user(
        self,
        access_key: str,
        *,
        secret_key: str | None = None,
        user_type: str | None = None,
        enabled: bool | None = None,
    ) -> User:
        with self._lock:
            old = self._users.get(access_key)
            if old is None:
                raise UserNotFound(f"user {access_key!r} does not exist")
            new = User(
                access_key,
                old.secret_key if secret_key is None else check_secret_key(secret_key),
                old.user_type if user_type is None else check_user_type(user_type),
                old.enabled if enabled is None else bool(enabled),
            )
            if not _manages(new):
                self._keep_a_manager(old, "disabled" if not new.enabled else "made a normal user")
            self._users[access_key] = new
            self._save()
        return new

    def delete_user(self, access_key: str) -> None:
        with self._lock:
            old = self._users.get(access_key)
            if old is None:
                raise UserNotFound(f"user {access_key!r} does not exist")
            self._keep_a_manager(old, "deleted")
            del self._users[access_key]
            self._acls.pop(access_key, None)  # a user's policies go with it (RocketMQ too)
            self._save()

    def _keep_a_manager(self, user: User, change: str) -> None:
        """Raise LastSuperUser when ``user`` is the last enabled super user. Locked."""
        if not _manages(user):
            return
        if any(_manages(u) for ak, u in self._users.items() if ak != user.access_key):
            return
        raise LastSuperUser(
            f"user {user.access_key!r} is the last enabled super user and cannot be {change}: "
            "nobody could manage users and ACLs afterwards; create or enable another super "
            "user first"
        )

    # -- ACLs ----------------------------------------------------------------

    def entries(self, access_key: str) -> list[PolicyEntry]:
        with self._lock:
            return list(self._acls.get(access_key, ()))

    def acls(self, subject: str | None = None, resource: str | None = None) -> dict[str, Any]:
        with self._lock:
            out = {}
            for ak, entries in sorted(self._acls.items()):
                if subject and ak != subject_user(subject):
                    continue
                shown = [
                    e.to_dict() for e in entries if not resource or str(e.resource) == resource
                ]
                if shown:
                    out[SUBJECT_PREFIX + ak] = shown
            return out

    def _subject_user(self, subject: object) -> str:
        access_key = subject_user(subject)
        if access_key not in self._users:
            raise UserNotFound(f"user {access_key!r} does not exist; create it first")
        return access_key

    def create_acl(self, subject: object, documents: Iterable[object]) -> list[PolicyEntry]:
        entries = [entry_from_dict(d) for d in documents]
        if not entries:
            raise IllegalPolicy("an ACL needs at least one policy entry")
        with self._lock:
            access_key = self._subject_user(subject)
            current = self._acls.setdefault(access_key, [])
            taken = {e.resource for e in current}
            for entry in entries:
                if entry.resource in taken:
                    raise AclExists(
                        f"User:{access_key} already has a policy for {entry.resource}; "
                        "use update to change it"
                    )
            current.extend(entries)
            self._save()
            return list(current)

    def update_acl(self, subject: object, documents: Iterable[object]) -> list[PolicyEntry]:
        entries = [entry_from_dict(d) for d in documents]
        if not entries:
            raise IllegalPolicy("an ACL needs at least one policy entry")
        with self._lock:
            access_key = self._subject_user(subject)
            replaced = {e.resource for e in entries}
            kept = [e for e in self._acls.get(access_key, []) if e.resource not in replaced]
            self._acls[access_key] = kept + entries
            self._save()
            return list(self._acls[access_key])

    def delete_acl(self, subject: object, resource: Resource | None = None) -> None:
        with self._lock:
            access_key = subject_user(subject)
            current = self._acls.get(access_key)
            if not current:
                raise AclNotFound(f"User:{access_key} has no ACL")
            if resource is None:
                del self._acls[access_key]
            else:
                kept = [e for e in current if e.resource != resource]
                if len(kept) == len(current):
                    raise AclNotFound(f"User:{access_key} has no policy for {resource}")
                self._acls[access_key] = kept
            self._save()
