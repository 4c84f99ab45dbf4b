"""The client's credentials: an access key and secret key that sign every request.

Requests carry the official clients' ``MQv2-HMAC-SHA1`` signature
(:mod:`halfmoon.auth.signature`), so a broker with authentication on accepts
halfmoon's client and the official ones alike. The secret never leaves the
process: it keys an HMAC, and ``repr`` leaves it out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from halfmoon import environment

ACCESS_ENV = environment.ACCESS_KEY.name
SECRET_ENV = environment.SECRET_KEY.name


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str = field(repr=False)

    @classmethod
    def from_env(cls) -> Credentials | None:
        """From ``HALFMOON_ACCESS_KEY`` / ``HALFMOON_SECRET_KEY``; None when unset."""
        access_key, secret_key = environment.ACCESS_KEY.get(), environment.SECRET_KEY.get()
        if access_key and secret_key:
            return cls(access_key, secret_key)
        return None
