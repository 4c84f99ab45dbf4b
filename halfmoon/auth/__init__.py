"""Authentication and authorization: signed requests, users, ACL 2.0 policies.

The front ends (gRPC servicer, admin API; in local mode and behind a proxy)
build one :class:`Guard` and ask it at their edge; see docs/security.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from halfmoon.auth.config import AuthConfig, TlsConfig
from halfmoon.auth.errors import Forbidden, Unauthenticated
from halfmoon.auth.guard import CLUSTER, Guard, Need, group, topic
from halfmoon.auth.policy import Resource, User
from halfmoon.auth.sealing import SecretBox
from halfmoon.auth.store import AuthStore

BOOTSTRAP_SECRET_ENV = "HALFMOON_BOOTSTRAP_SECRET_KEY"

__all__ = [
    "CLUSTER",
    "AuthConfig",
    "AuthStore",
    "Forbidden",
    "Guard",
    "Need",
    "Resource",
    "TlsConfig",
    "Unauthenticated",
    "User",
    "group",
    "local_guard",
    "topic",
]


def local_guard(config: AuthConfig, data_dir: Path) -> Guard:
    """The guard of local mode: users and ACLs in ``<data_dir>/auth``; the first super user
    created from ``auth.bootstrap_*`` when there is no user yet."""
    key_file = config.key_file or data_dir / "auth" / "key"
    store = AuthStore(data_dir / "auth" / "users.json", SecretBox.from_file(key_file))
    secret = os.environ.get(BOOTSTRAP_SECRET_ENV)
    if config.bootstrap_access_key and secret and not store.users():
        store.create_user(config.bootstrap_access_key, secret, "Super")
    return Guard(config, store)
