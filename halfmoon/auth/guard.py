"""The one check at every edge: who is asking (authentication), may they (authorization).

The gRPC edge (:mod:`halfmoon.server.handlers`) and the admin API
(:mod:`halfmoon.server.admin_auth`) both turn a request into *credentials*
and a list of :class:`Need` s, and call :meth:`Guard.check`; neither knows
how a signature verifies or a policy is evaluated. A need is satisfied by
any of its alternatives (``QueryRoute`` needs Pub *or* Sub on the topic);
every need of a request must be satisfied.

Every denial writes one line to the ``halfmoon.audit`` logger: the reason,
the access key (never a secret or signature), the peer, the operation and
the missing permission.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from halfmoon.auth import signature
from halfmoon.auth.config import AuthConfig, parse_utc_offset
from halfmoon.auth.errors import Forbidden, Unauthenticated
from halfmoon.auth.policy import Resource, User, decide
from halfmoon.auth.store import AuthStore

audit = logging.getLogger("halfmoon.audit")
# An audit field printed as is; anything else (an attacker's access key with spaces, quotes
# or a newline, an admin operation "GET /v1/…") is quoted, so one denial stays one line
# whose key=value fields cannot be forged.
_PLAIN_FIELD = re.compile(r"[A-Za-z0-9_.@:/{}*%\[\]-]{1,128}")
# Verified headers remembered (one per client and second); cleared whole when full.
_VERIFIED_CACHE = 10_000


@dataclass(frozen=True)
class Need:
    """One permission a request needs: any of ``alternatives`` (resource, action) will do."""

    alternatives: tuple[tuple[Resource, str], ...]

    @classmethod
    def of(cls, resource: Resource, *actions: str) -> Need:
        return cls(tuple((resource, a) for a in actions))

    def describe(self) -> str:
        return " or ".join(f"{action} on {resource}" for resource, action in self.alternatives)


CLUSTER = Resource("Cluster")


def topic(name: str) -> Resource:
    return Resource("Topic", name)


def group(name: str) -> Resource:
    return Resource("Group", name)


class Guard:
    def __init__(
        self, config: AuthConfig, store: AuthStore, clock: Callable[[], float] = time.time
    ) -> None:
        self.enabled = config.enabled
        self.store = store
        self._clock = clock
        self._window = config.signature_window
        offsets = {0, signature.server_utc_offset()}
        offsets.update(parse_utc_offset(o) for o in config.client_utc_offsets)
        self._offsets = tuple(sorted(offsets))
        # (authorization, x-mq-date-time) → (user as verified, stamp): a client reuses one
        # header for every request of a second, so the HMAC runs once per client-second. A
        # changed user (new secret, disabled) is a new object and misses.
        self._verified: dict[tuple[str, str], tuple[User, int]] = {}

    # -- authentication ------------------------------------------------------

    def _known_user(self, access_key: str, operation: str, peer: str) -> User:
        user = self.store.user(access_key)
        if user is None or not user.enabled:
            # One answer for unknown and disabled: the caller learns no more than "no".
            self._deny("unauthenticated", access_key, peer, operation, "unknown or disabled user")
            raise Unauthenticated(
                f"access key {access_key[:128]!r} is unknown or disabled; check the credentials"
            )
        return user

    def _check_fresh(self, peer: str, operation: str) -> None:
        try:
            self.store.check_fresh()
        except Unauthenticated as exc:
            self._deny("unauthenticated", "", peer, operation, exc.message)
            raise

    def authenticate_signed(self, metadata: Mapping[str, str], peer: str, operation: str) -> User:
        """The user whose MQv2-HMAC-SHA1 signature ``metadata`` carries; Unauthenticated else."""
        self._check_fresh(peer, operation)
        key = (metadata.get(signature.AUTHORIZATION, ""), metadata.get(signature.DATE_TIME, ""))
        hit = self._verified.get(key)
        if (
            hit is not None
            and self.store.user(hit[0].access_key) is hit[0]
            and hit[0].enabled
            and signature.stamp_within_window(hit[1], self._clock(), self._window, self._offsets)
        ):
            return hit[0]
        user = self._verify(metadata, peer, operation)
        verified_stamp = signature.stamp_seconds(key[1])
        if verified_stamp is not None:
            if len(self._verified) >= _VERIFIED_CACHE:
                self._verified.clear()
            self._verified[key] = (user, verified_stamp)
        return user

    def _verify(self, metadata: Mapping[str, str], peer: str, operation: str) -> User:
        try:
            request = signature.parse(metadata)
        except Unauthenticated as exc:
            self._deny("unauthenticated", "", peer, operation, exc.message)
            raise
        user = self._known_user(request.access_key, operation, peer)
        if not signature.verifies(request, user.secret_key):
            self._deny("unauthenticated", user.access_key, peer, operation, "bad signature")
            raise Unauthenticated("the request signature does not verify; check the secret key")
        if not signature.within_window(
            request.date_time, self._clock(), self._window, self._offsets
        ):
            self._deny("unauthenticated", user.access_key, peer, operation, "stale signature")
            raise Unauthenticated(
                f"the signature's x-mq-date-time is more than {self._window:g} s from the "
                "server's clock (a replay, or a skewed clock; see auth.client_utc_offsets)"
            )
        return user

    def authenticate_http(self, header: str, peer: str, operation: str) -> User:
        """The user of an ``Authorization: Basic base64(ak:sk)`` or ``Bearer ak:sk`` header."""
        self._check_fresh(peer, operation)
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() == "basic":
            try:
                pair = base64.b64decode(value.strip(), validate=True).decode()
            except (binascii.Error, ValueError):
                pair = ""
        elif scheme.lower() == "bearer":
            pair = value.strip()
        else:
            pair = ""
        access_key, sep, secret_key = pair.partition(":")
        if not sep or not access_key:
            self._deny("unauthenticated", "", peer, operation, "no credentials")
            raise Unauthenticated(
                "the admin API needs credentials: HTTP Basic (access key, secret key) or "
                "'Authorization: Bearer ACCESS_KEY:SECRET_KEY'"
            )
        return self.authenticate_password(access_key, secret_key, peer, operation)

    def authenticate_password(
        self, access_key: str, secret_key: str, peer: str, operation: str
    ) -> User:
        """The user whose access key and secret key these are (AMQP's PLAIN and AMQPLAIN
        carry them as user name and password); Unauthenticated else."""
        self._check_fresh(peer, operation)
        user = self._known_user(access_key, operation, peer)
        if not hmac.compare_digest(user.secret_key.encode(), secret_key.encode()):
            self._deny("unauthenticated", access_key, peer, operation, "wrong secret key")
            raise Unauthenticated("the secret key is wrong")
        return user

    # -- authorization -------------------------------------------------------

    def may(self, user: User, resource: Resource, action: str, peer: str) -> bool:
        return decide(user, self.store.entries(user.access_key), resource, action, peer)

    def authorize(self, user: User, needs: Sequence[Need], peer: str, operation: str) -> None:
        """Raise Forbidden naming the first need ``user`` does not meet."""
        if user.is_super:
            return
        entries = self.store.entries(user.access_key)
        for need in needs:
            if not any(decide(user, entries, r, a, peer) for r, a in need.alternatives):
                self._deny("forbidden", user.access_key, peer, operation, need.describe())
                raise Forbidden(
                    f"user {user.access_key!r} is not allowed {need.describe()} "
                    f"({operation}); ask an administrator for that permission"
                )

    def audit_denial(self, user: User, peer: str, operation: str, what: str) -> None:
        """Log a refusal the caller decided on its own (a front end's rule), as authorize does."""
        self._deny("forbidden", user.access_key, peer, operation, what)

    def require_super(self, user: User, peer: str, operation: str) -> None:
        if not user.is_super:
            self._deny("forbidden", user.access_key, peer, operation, "super user")
            raise Forbidden(f"{operation} is for super users only")

    def publish_filter(self, user: User | None, peer: str) -> Callable[[str], bool] | None:
        """Which topics ``user`` may Pub on (transaction checks go only to those producers)."""
        if user is None or user.is_super:
            return None
        return lambda name: self.may(user, topic(name), "Pub", peer)

    def _deny(self, reason: str, access_key: str, peer: str, operation: str, what: str) -> None:
        audit.warning(
            "event=access_denied reason=%s user=%s peer=%s operation=%s detail=%s",
            reason,
            audit_field(access_key[:128]),
            audit_field(peer),
            audit_field(operation),
            ascii(what),
        )


def audit_field(value: str) -> str:
    """``value`` as one audit log field: bare when plain, else quoted with escapes (ASCII)."""
    if not value:
        return "-"
    return value if _PLAIN_FIELD.fullmatch(value) else ascii(value)
