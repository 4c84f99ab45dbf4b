"""Authentication and authorization: signed requests, users, ACL 2.0 policies.

The front ends (gRPC servicer, admin API; in local mode and behind a proxy)
build one :class:`Guard` and ask it at their edge; see docs/security.md.
"""

from __future__ import annotations

from pathlib import Path

from halfmoon import environment
from halfmoon.auth.bootstrap import BOOTSTRAP_SECRET_ENV, bootstrap_user
from halfmoon.auth.config import AuthConfig, TlsConfig
from halfmoon.auth.errors import Forbidden, Unauthenticated
from halfmoon.auth.guard import CLUSTER, Guard, Need, group, topic
from halfmoon.auth.policy import Resource, User
from halfmoon.auth.sealing import SecretBox
from halfmoon.auth.store import AuthStore

__all__ = [
    "BOOTSTRAP_SECRET_ENV",
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
    "bootstrap_user",
    "group",
    "local_guard",
    "topic",
]


def local_guard(config: AuthConfig, data_dir: Path) -> Guard:
    """The guard of local mode: users and ACLs in ``<data_dir>/auth``; the first super user
    created from ``auth.bootstrap_*`` when there is no user yet (remade with
    ``auth.bootstrap_recover``)."""
    key_file = config.key_file or data_dir / "auth" / "key"
    store = AuthStore(data_dir / "auth" / "users.json", SecretBox.from_file(key_file))
    bootstrap_user(store, config, environment.BOOTSTRAP_SECRET_KEY.get())
    return Guard(config, store)
