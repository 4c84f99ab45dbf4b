"""The bootstrap super user: made at the first start, and remade to recover a locked-out broker.

``auth.bootstrap_access_key`` names it; its secret key comes from
``HALFMOON_BOOTSTRAP_SECRET_KEY`` only (never a file, never --print-config).
Without ``auth.bootstrap_recover`` it is created once, when no user exists.
With it, every start makes that user an enabled super user with that secret
key, whatever users exist: the way back in when no enabled super user is left
or the last one's secret key is lost (docs/security.md, "Recovering access").
It is the same code in local mode (``<data_dir>/auth/users.json``) and on a
cluster proxy (the document in etcd, changed under compare-and-swap), and it
logs ``event=bootstrap_user_recovered`` each time, so it is not left on
unnoticed.
"""

from __future__ import annotations

import contextlib
import logging

from halfmoon import environment
from halfmoon.auth.config import AuthConfig
from halfmoon.auth.errors import UserExists
from halfmoon.auth.store import AuthStore

log = logging.getLogger("halfmoon.audit")

BOOTSTRAP_SECRET_ENV = environment.BOOTSTRAP_SECRET_KEY.name


def bootstrap_user(store: AuthStore, config: AuthConfig, secret: str | None) -> None:
    """Create the first super user, or (``bootstrap_recover``) remake it."""
    access_key = config.bootstrap_access_key
    if config.bootstrap_recover:
        if not access_key or not secret:
            from halfmoon.config import ConfigError  # halfmoon.config imports this package

            raise ConfigError(
                "auth.bootstrap_recover needs auth.bootstrap_access_key and the new secret "
                f"key in ${BOOTSTRAP_SECRET_ENV}: the super user to make and its secret"
            )
        _recover(store, access_key, secret)
        return
    if access_key and secret and not store.users():
        with contextlib.suppress(UserExists):  # another proxy of the cluster made it first
            store.create_user(access_key, secret, "Super")


def _recover(store: AuthStore, access_key: str, secret: str) -> None:
    if store.user(access_key) is None:
        with contextlib.suppress(UserExists):  # made meanwhile (another proxy): update it
            store.create_user(access_key, secret, "Super")
            log.warning("event=bootstrap_user_recovered user=%s created=true", access_key)
            return
    store.update_user(access_key, secret_key=secret, user_type="Super", enabled=True)
    log.warning(
        "event=bootstrap_user_recovered user=%s created=false "
        "(remove auth.bootstrap_recover once you are back in)",
        access_key,
    )
