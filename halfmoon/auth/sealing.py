"""Secrets encrypted at rest: the users file holds sealed secret keys, never plain ones.

The broker must recover a secret key to verify a signature (an HMAC keyed by
it), so secrets are encrypted, not hashed. The construction uses only the
standard library: HMAC-SHA256 as a pseudo-random function in counter mode
for the keystream and HMAC-SHA256 over nonce and ciphertext as the tag
(encrypt-then-MAC), with keys derived from the one master key for each
purpose. A sealed value reads ``v1:<base64(nonce 16 | ciphertext | tag 32)>``.

The master key comes from ``auth.key_file`` (32 random bytes, hex); when
unset, ``<data_dir>/auth/key`` is created on first start with mode 600. A
data directory copied without its key file keeps its secrets unreadable.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from halfmoon.auth.errors import AuthStoreCorrupt

_PREFIX = "v1:"
_NONCE = 16
_TAG = 32
_BLOCK = 32


class SecretBox:
    def __init__(self, master_key: bytes) -> None:
        if len(master_key) < 16:
            raise AuthStoreCorrupt("the auth key must be at least 16 bytes")
        self._enc = hmac.new(master_key, b"halfmoon secret encryption", hashlib.sha256).digest()
        self._mac = hmac.new(master_key, b"halfmoon secret authentication", hashlib.sha256).digest()

    @classmethod
    def from_file(cls, path: Path, *, create: bool = True) -> SecretBox:
        """The box keyed by ``path`` (hex); created with mode 600 when missing and ``create``."""
        if not path.exists():
            if not create:
                raise AuthStoreCorrupt(f"the auth key file {path} does not exist")
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(32) + "\n")
                out.flush()
                os.fsync(out.fileno())
        try:
            key = bytes.fromhex(path.read_text().strip())
        except ValueError:
            raise AuthStoreCorrupt(f"the auth key file {path} does not hold hex bytes") from None
        return cls(key)

    def _keystream(self, nonce: bytes, length: int) -> bytes:
        blocks = []
        for counter in range((length + _BLOCK - 1) // _BLOCK):
            block = nonce + counter.to_bytes(8, "big")
            blocks.append(hmac.new(self._enc, block, hashlib.sha256).digest())
        return b"".join(blocks)[:length]

    def seal(self, plaintext: str) -> str:
        data = plaintext.encode()
        nonce = secrets.token_bytes(_NONCE)
        cipher = bytes(a ^ b for a, b in zip(data, self._keystream(nonce, len(data)), strict=True))
        tag = hmac.new(self._mac, nonce + cipher, hashlib.sha256).digest()
        return _PREFIX + base64.b64encode(nonce + cipher + tag).decode()

    def open(self, sealed: str) -> str:
        if not sealed.startswith(_PREFIX):
            raise AuthStoreCorrupt("a sealed secret has an unknown format")
        try:
            raw = base64.b64decode(sealed[len(_PREFIX) :], validate=True)
        except ValueError:
            raise AuthStoreCorrupt("a sealed secret is not base64") from None
        if len(raw) < _NONCE + _TAG:
            raise AuthStoreCorrupt("a sealed secret is truncated")
        nonce, cipher, tag = raw[:_NONCE], raw[_NONCE:-_TAG], raw[-_TAG:]
        expected = hmac.new(self._mac, nonce + cipher, hashlib.sha256).digest()
        if not hmac.compare_digest(expected, tag):
            raise AuthStoreCorrupt(
                "a sealed secret does not verify: the auth key is not the one it was sealed with"
            )
        stream = self._keystream(nonce, len(cipher))
        return bytes(a ^ b for a, b in zip(cipher, stream, strict=True)).decode()
