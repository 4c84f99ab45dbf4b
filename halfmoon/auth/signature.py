"""The official clients' request signature, ``MQv2-HMAC-SHA1``, verified as RocketMQ does.

Every request of a client given credentials carries two metadata entries::

    x-mq-date-time: 20261124T194608Z
    authorization:  MQv2-HMAC-SHA1 Credential=<AccessKey>, SignedHeaders=x-mq-date-time,
                    Signature=<hex HMAC-SHA1 of the x-mq-date-time value, keyed by the SecretKey>

RocketMQ's ``DefaultAuthenticationContextBuilder`` splits the value at the
first space, then the rest at commas into ``key=value`` items, decodes the
signature from hex and compares it with its own HMAC of the date-time; so
do we (hex in either case: the Python client sends lowercase, the Node
client uppercase). The Python client sends an empty ``Credential=`` when it
has no credentials: that is "no credentials", answered UNAUTHORIZED.

**The replay window** (RocketMQ has none). The Python client formats its
*local* time with a ``Z`` suffix (``datetime.now()``), the Node client real
UTC, so the stamp is not always UTC. A signature is accepted when its stamp,
read as UTC and shifted by one of the *accepted zone offsets*, is within
``window`` seconds of the server's clock. The accepted offsets are zero, the
server's own local offset (a client in the server's time zone), and any
configured in ``auth.client_utc_offsets``; a Python client in yet another
zone needs its offset listed there. A captured header is therefore usable
for ``window`` seconds only (per accepted offset); TLS keeps it from being
captured at all. Within the window a header may be sent again: the clients
sign with one-second stamps and send many requests per second with the same
header, so repetition alone cannot mean replay.
"""

from __future__ import annotations

import binascii
import calendar
import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from halfmoon.auth.errors import Unauthenticated

ALGORITHM = "MQv2-HMAC-SHA1"
AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
_DATE_FORMAT = "%Y%m%dT%H%M%SZ"
# Longest header value parsed; a real one is ~120 characters.
_MAX_HEADER = 1024


@dataclass(frozen=True)
class SignedRequest:
    access_key: str
    signature: bytes  # the decoded HMAC
    date_time: str


def sign(secret_key: str, date_time: str) -> str:
    """The hex signature a client sends for ``date_time`` (lowercase, as the Python client)."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def authorization_header(access_key: str, secret_key: str, date_time: str) -> str:
    """The ``authorization`` value the official clients send."""
    return (
        f"{ALGORITHM} Credential={access_key}, SignedHeaders={DATE_TIME}, "
        f"Signature={sign(secret_key, date_time)}"
    )


def utc_stamp(now: float | None = None) -> str:
    """``now`` (default: the clock) as an ``x-mq-date-time`` value, in UTC."""
    return time.strftime(_DATE_FORMAT, time.gmtime(time.time() if now is None else now))


def parse(metadata: Mapping[str, str]) -> SignedRequest:
    """The signed request ``metadata`` carries; Unauthenticated when none or malformed."""
    header = metadata.get(AUTHORIZATION, "")
    if not header:
        raise Unauthenticated(
            "the request carries no credentials; configure the client with an access key "
            "and secret key"
        )
    if len(header) > _MAX_HEADER:
        raise Unauthenticated("the authorization header is too long to be a signature")
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise Unauthenticated(f"unsupported authorization scheme; expected {ALGORITHM}")
    items: dict[str, str] = {}
    for item in rest.split(","):
        key, sep, value = item.strip().partition("=")
        if sep:
            items[key.strip()] = value.strip()
    access_key = items.get("Credential", "")
    if not access_key:
        raise Unauthenticated(
            "the request carries no credentials (empty Credential); configure the client "
            "with an access key and secret key"
        )
    try:
        signature = binascii.unhexlify(items.get("Signature", ""))
    except (binascii.Error, ValueError):
        raise Unauthenticated("the signature is not hexadecimal") from None
    if not signature:
        raise Unauthenticated("the authorization header carries no Signature")
    date_time = metadata.get(DATE_TIME, "")
    if not date_time:
        raise Unauthenticated(f"the signed header {DATE_TIME} is missing")
    return SignedRequest(access_key, signature, date_time)


def verifies(request: SignedRequest, secret_key: str) -> bool:
    """True when ``request``'s signature is the HMAC of its date-time under ``secret_key``."""
    expected = hmac.new(secret_key.encode(), request.date_time.encode(), hashlib.sha1).digest()
    return hmac.compare_digest(expected, request.signature)


def stamp_seconds(date_time: str) -> int | None:
    """The stamp read as UTC, in epoch seconds; None when it is not a date-time."""
    # Sliced by hand: time.strptime costs ~10 µs, on every request.
    if len(date_time) != 16 or date_time[8] != "T" or date_time[15] != "Z":
        return None
    digits = date_time[:8] + date_time[9:15]
    if not digits.isascii() or not digits.isdigit():
        return None
    year, month, day = int(digits[:4]), int(digits[4:6]), int(digits[6:8])
    hour, minute, second = int(digits[8:10]), int(digits[10:12]), int(digits[12:14])
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        return None
    return calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))


def server_utc_offset(now: float | None = None) -> int:
    """This machine's local zone offset from UTC, seconds (east positive)."""
    local = time.localtime(time.time() if now is None else now)
    return int(local.tm_gmtoff)


def within_window(date_time: str, now: float, window: float, offsets: Iterable[int]) -> bool:
    """True when ``date_time`` shifted by one of ``offsets`` is within ``window`` of ``now``."""
    stamp = stamp_seconds(date_time)
    return stamp is not None and stamp_within_window(stamp, now, window, offsets)


def stamp_within_window(stamp: int, now: float, window: float, offsets: Iterable[int]) -> bool:
    return any(abs(stamp - offset - now) <= window for offset in offsets)
