"""PLAIN and AMQPLAIN: a user name and password out of Connection.Start-Ok's response.

PLAIN's response is ``\\0user\\0password`` (RFC 4616, without an authorization
identity, as pika and aio-pika send it); AMQPLAIN's is a field table without
its length prefix holding ``LOGIN`` and ``PASSWORD``. halfmoon's users are
access key / secret key pairs: the user name is the access key, the password
the secret key.
"""

from __future__ import annotations

import struct

from halfmoon.amqp.reply_codes import ACCESS_REFUSED, AmqpConnectionError

MECHANISMS = ("PLAIN", "AMQPLAIN")


def credentials(mechanism: str, response: bytes) -> tuple[str, str]:
    """The (user, password) in ``response``; 403 ACCESS_REFUSED when it holds none."""
    if mechanism == "PLAIN":
        parts = response.split(b"\x00")
        if len(parts) != 3:
            raise _refused(mechanism)
        return _text(parts[1], mechanism), _text(parts[2], mechanism)
    if mechanism == "AMQPLAIN":
        from pamqp.decode import by_type

        try:
            _, table = by_type(struct.pack(">I", len(response)) + response, "table")
        except Exception:  # noqa: BLE001 - any malformed table is a refusal, not a crash
            raise _refused(mechanism) from None
        if not isinstance(table, dict):
            raise _refused(mechanism)
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if not isinstance(login, str | bytes) or not isinstance(password, str | bytes):
            raise _refused(mechanism)
        return _text(login, mechanism), _text(password, mechanism)
    raise AmqpConnectionError(
        ACCESS_REFUSED,
        f"authentication mechanism {mechanism!r} is not supported: use " + " or ".join(MECHANISMS),
    )


def _text(value: str | bytes, mechanism: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise _refused(mechanism) from None


def _refused(mechanism: str) -> AmqpConnectionError:
    return AmqpConnectionError(
        ACCESS_REFUSED,
        f"Login was refused using authentication mechanism {mechanism}: the response holds "
        "no user name and password",
    )
