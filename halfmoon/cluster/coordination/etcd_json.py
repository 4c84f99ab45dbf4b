"""etcd's JSON gateway, the part both the asyncio client and the CLI need: standard library only.

etcd serves its v3 gRPC API as JSON over HTTP at ``/v3/...`` (etcd 3.4 also
answers ``/v3beta/``; ``/v3/`` is the name that stays). Keys and values travel
base64-encoded, 64-bit integers as decimal strings, and fields at their
default value (0, false, empty) are left out of answers. A failed call answers
``{"error": ..., "message": ..., "code": N}`` with N a gRPC status code.

The CLI reads the cluster with :func:`call_sync` (urllib, so the
command line starts without importing aiohttp); servers use
:class:`halfmoon.cluster.coordination.etcd.EtcdClient`.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from halfmoon.cluster.coordination.etcd_tls import EtcdTls
from halfmoon.cluster.errors import BadCoordinatorAddress, CoordinatorUnavailable

API_PREFIX = "/v3"
SCHEME = "etcd://"
# gRPC status codes etcd answers with when the fault is the server's or the network's,
# not the request's: UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, UNKNOWN.
_SERVER_SIDE_CODES = frozenset({14, 4, 13, 2})


def parse_coordinator(url: str) -> tuple[str, ...]:
    """``etcd://HOST:PORT[,HOST:PORT...]`` as the gateway base URLs, in the order given."""
    if not isinstance(url, str) or not url.startswith(SCHEME):
        raise BadCoordinatorAddress(
            f"bad coordinator address {url!r}: expected etcd://HOST:PORT[,HOST:PORT...]"
        )
    endpoints = []
    for part in url[len(SCHEME) :].rstrip("/").split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise BadCoordinatorAddress(
                f"bad coordinator address {url!r}: {part!r} is not HOST:PORT"
            )
        endpoints.append(f"http://{host}:{int(port)}")
    return tuple(endpoints)


def b64(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes | str) -> bytes:
    """The ``range_end`` that makes a range request cover every key starting with ``prefix``."""
    raw = bytearray(prefix.encode() if isinstance(prefix, str) else prefix)
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"  # every key


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    def json(self) -> Any:
        return json.loads(self.value)


def key_value(data: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=unb64(data.get("key")).decode(),
        value=unb64(data.get("value")),
        create_revision=int(data.get("create_revision", 0)),
        mod_revision=int(data.get("mod_revision", 0)),
        version=int(data.get("version", 0)),
        lease=int(data.get("lease", 0)),
    )


def header_revision(answer: dict[str, Any]) -> int:
    return int(answer.get("header", {}).get("revision", 0))


def raise_for_answer(endpoint: str, status: int, answer: Any) -> dict[str, Any]:
    """The answer if it is one; a gateway error as a HalfmoonError.

    Errors about the request itself (a lease not found, a compacted revision)
    are the caller's to interpret, so they come back as
    :class:`EtcdRequestError`; the server's own faults as
    :class:`CoordinatorUnavailable`.
    """
    if not isinstance(answer, dict):
        raise CoordinatorUnavailable(f"etcd at {endpoint} answered {status} with no JSON object")
    if "error" in answer or status >= 400:
        code = int(answer.get("code", 2))
        message = str(answer.get("message") or answer.get("error") or f"HTTP {status}")
        if code in _SERVER_SIDE_CODES or status >= 500 and code == 2:
            raise CoordinatorUnavailable(f"etcd at {endpoint} failed: {message}")
        raise EtcdRequestError(message, grpc_code=code)
    return answer


class EtcdRequestError(Exception):
    """etcd refused a well-formed call (lease not found, revision compacted, ...).

    Internal to this package: callers turn it into a HalfmoonError or act on it.
    """

    def __init__(self, message: str, *, grpc_code: int) -> None:
        super().__init__(message)
        self.grpc_code = grpc_code


def call_sync(
    endpoints: Sequence[str],
    path: str,
    body: dict[str, Any],
    timeout: float = 5.0,
    *,
    tls: EtcdTls,
) -> dict[str, Any]:
    """One gateway call (``/v3`` + ``path``) on the first endpoint that answers."""
    data = json.dumps(body).encode()
    failures = []
    for endpoint in endpoints:
        request = urllib.request.Request(
            f"{tls.url(endpoint)}{API_PREFIX}{path}",
            data=data,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(
                request, timeout=timeout, context=tls.ssl_context
            ) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        except (OSError, urllib.error.URLError) as error:
            failures.append(f"{urllib.parse.urlsplit(endpoint).netloc}: {error}")
            continue
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        return raise_for_answer(endpoint, status, answer)
    raise CoordinatorUnavailable(f"no etcd endpoint answered ({'; '.join(failures)})")


def range_prefix_sync(
    endpoints: Sequence[str], prefix: str, timeout: float = 5.0, *, tls: EtcdTls
) -> tuple[list[KeyValue], int]:
    """Every key under ``prefix`` and the revision read at, from the first endpoint that answers."""
    answer = call_sync(
        endpoints,
        "/kv/range",
        {"key": b64(prefix), "range_end": b64(prefix_end(prefix))},
        timeout,
        tls=tls,
    )
    return [key_value(kv) for kv in answer.get("kvs", [])], header_revision(answer)
