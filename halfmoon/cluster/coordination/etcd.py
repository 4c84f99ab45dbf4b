"""An asyncio etcd v3 client over etcd's JSON gateway (aiohttp): the calls halfmoon needs.

Key-value reads and writes, compare-and-swap transactions, leases (grant,
keep-alive, revoke) and prefix watches that start at a given revision. Why the
gateway and not a gRPC client: see docs/cluster.md, "Choices".

Every call tries the endpoints in turn, starting with the last one that
answered; when none answers it raises
:class:`~halfmoon.cluster.errors.CoordinatorUnavailable`. Nothing here retries
a write that may have been applied: the callers' writes are idempotent puts or
compare-and-swaps, which they re-read on doubt.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from halfmoon.cluster.coordination.etcd_json import (
    API_PREFIX,
    EtcdRequestError,
    KeyValue,
    b64,
    header_revision,
    key_value,
    parse_coordinator,
    prefix_end,
    raise_for_answer,
)
from halfmoon.cluster.coordination.etcd_tls import PLAIN, EtcdTls
from halfmoon.cluster.errors import CoordinatorUnavailable

DEFAULT_TIMEOUT_S = 5.0
GRPC_NOT_FOUND = 5
GRPC_OUT_OF_RANGE = 11  # "required revision has been compacted"


@dataclass(frozen=True)
class WatchEvent:
    kind: str  # "PUT" or "DELETE"
    kv: KeyValue


@dataclass(frozen=True)
class WatchBatch:
    """One answer on a watch stream: events at ``revision`` (none for a progress note)."""

    revision: int
    events: list[WatchEvent] = field(default_factory=list)


class WatchCompacted(Exception):
    """The watch's start revision is older than etcd's compaction: re-list, then watch again."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"revisions below {compact_revision} were compacted")
        self.compact_revision = compact_revision


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction: ``target`` of ``key`` compared with ``value``.

    ``target`` is ``CREATE`` (create revision; 0 means the key is absent),
    ``MOD`` (last modification revision), ``VERSION``, ``VALUE`` or ``LEASE`` (the lease
    the key is attached to). With ``prefix``, every key starting with ``key`` must
    compare so; none there compares as one absent key (``CREATE`` 0 holds: "no key under
    the prefix"), but for ``VALUE``, which then never holds.
    """

    key: str
    target: str
    value: int | bytes
    result: str = "EQUAL"
    prefix: bool = False

    def json(self) -> dict[str, Any]:
        field_name = {
            "CREATE": "create_revision",
            "MOD": "mod_revision",
            "VERSION": "version",
            "VALUE": "value",
            "LEASE": "lease",
        }[self.target]
        encoded = b64(self.value) if isinstance(self.value, bytes) else str(self.value)
        compared = {
            "key": b64(self.key),
            "target": self.target,
            "result": self.result,
            field_name: encoded,
        }
        if self.prefix:
            compared["range_end"] = b64(prefix_end(self.key))
        return compared


def put_op(key: str, value: bytes, lease: int = 0) -> dict[str, Any]:
    request: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        request["lease"] = str(lease)
    return {"request_put": request}


def get_op(key: str) -> dict[str, Any]:
    return {"request_range": {"key": b64(key)}}


def delete_op(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": b64(key)}}


def delete_prefix_op(prefix: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": b64(prefix), "range_end": b64(prefix_end(prefix))}}


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
    # The key-values read by the branch that ran (its get_op requests), in order.
    kvs: list[KeyValue]


class EtcdClient:
    def __init__(
        self, endpoints: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT_S, tls: EtcdTls = PLAIN
    ) -> None:
        if not endpoints:
            raise ValueError("an etcd client needs at least one endpoint")
        self.endpoints = tuple(endpoints)
        self.tls = tls
        self.timeout = timeout
        self._preferred = 0
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_url(
        cls, url: str, *, timeout: float = DEFAULT_TIMEOUT_S, tls: EtcdTls = PLAIN
    ) -> EtcdClient:
        """A client of ``etcd://HOST:PORT[,HOST:PORT...]``."""
        return cls(parse_coordinator(url), timeout=timeout, tls=tls)

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    def _ordered_endpoints(self) -> list[tuple[int, str]]:
        n = len(self.endpoints)
        return [
            ((self._preferred + i) % n, self.endpoints[(self._preferred + i) % n]) for i in range(n)
        ]

    async def call(
        self, path: str, body: dict[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """One unary gateway call (``/v3`` + ``path``) on the first endpoint that answers."""
        failures = []
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout)
        for index, endpoint in self._ordered_endpoints():
            try:
                async with self._http().post(
                    f"{self.tls.url(endpoint)}{API_PREFIX}{path}",
                    json=body,
                    timeout=timeout,
                    ssl=self.tls.ssl_context or True,
                ) as response:
                    status = response.status
                    answer = await response.json(content_type=None)
            except (TimeoutError, aiohttp.ClientError, ValueError) as error:
                failures.append(f"{endpoint}: {error or type(error).__name__}")
                continue
            self._preferred = index
            return raise_for_answer(endpoint, status, answer)
        raise CoordinatorUnavailable(f"no etcd endpoint answered ({'; '.join(failures)})")

    # Key-value -----------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        answer = await self.call("/kv/range", {"key": b64(key)})
        kvs = answer.get("kvs", [])
        return key_value(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` (sorted by key) and the revision they were read at."""
        answer = await self.call(
            "/kv/range", {"key": b64(prefix), "range_end": b64(prefix_end(prefix))}
        )
        return [key_value(kv) for kv in answer.get("kvs", [])], header_revision(answer)

    async def count_prefix(self, prefix: str) -> int:
        """How many keys start with ``prefix`` (counted by etcd: no values travel)."""
        answer = await self.call(
            "/kv/range",
            {"key": b64(prefix), "range_end": b64(prefix_end(prefix)), "count_only": True},
        )
        return int(answer.get("count", 0))

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write ``key``; returns the revision of the write."""
        return header_revision(await self.call("/kv/put", put_op(key, value, lease)["request_put"]))

    async def delete(self, key: str) -> bool:
        answer = await self.call("/kv/deleterange", {"key": b64(key)})
        return int(answer.get("deleted", 0)) > 0

    async def delete_prefix(self, prefix: str) -> int:
        answer = await self.call(
            "/kv/deleterange", {"key": b64(prefix), "range_end": b64(prefix_end(prefix))}
        )
        return int(answer.get("deleted", 0))

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[dict[str, Any]],
        failure: Sequence[dict[str, Any]] = (),
    ) -> TxnResult:
        """If every ``compare`` holds run ``success``, else ``failure``: atomically, in etcd."""
        answer = await self.call(
            "/kv/txn",
            {
                "compare": [c.json() for c in compare],
                "success": list(success),
                "failure": list(failure),
            },
        )
        kvs = []
        for response in answer.get("responses", []):
            for kv in response.get("response_range", {}).get("kvs", []):
                kvs.append(key_value(kv))
        return TxnResult(bool(answer.get("succeeded", False)), header_revision(answer), kvs)

    async def create(self, key: str, value: bytes, *, lease: int = 0) -> tuple[bool, KeyValue]:
        """Write ``key`` only if it is absent. Returns (created, the value stored now)."""
        result = await self.txn(
            [Compare(key, "CREATE", 0)], [put_op(key, value, lease)], [get_op(key)]
        )
        if result.succeeded:
            return True, KeyValue(key, value, result.revision, result.revision, 1, lease)
        if not result.kvs:  # deleted between the compare and the read: cannot be, in one txn
            raise CoordinatorUnavailable(f"etcd answered a failed create of {key!r} without it")
        return False, result.kvs[0]

    async def ping(self, timeout_s: float) -> int:
        """Ask etcd for its status within ``timeout_s``; its current revision."""
        return header_revision(await self.call("/maintenance/status", {}, timeout_s=timeout_s))

    # Leases --------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> int:
        answer = await self.call("/lease/grant", {"TTL": str(ttl_s)})
        return int(answer["ID"])

    async def keep_alive(self, lease: int) -> int:
        """Renew ``lease`` once; returns its new TTL in seconds, 0 when it has expired."""
        answer = await self.call("/lease/keepalive", {"ID": str(lease)})
        return int(answer.get("result", {}).get("TTL", 0))

    async def revoke_lease(self, lease: int) -> bool:
        """Revoke ``lease`` (deleting every key attached to it); False if it had expired."""
        try:
            await self.call("/lease/revoke", {"ID": str(lease)})
        except EtcdRequestError as error:
            if error.grpc_code == GRPC_NOT_FOUND:
                return False
            raise
        return True

    # Watches -------------------------------------------------------------------------

    async def watch_prefix(
        self, prefix: str, start_revision: int, *, progress_notify: bool = True
    ) -> AsyncGenerator[WatchBatch, None]:
        """Every change under ``prefix`` from ``start_revision`` on, as etcd reports them.

        The first batch (no events) confirms the watch is in place. Raises
        :class:`WatchCompacted` when ``start_revision`` is no longer kept, and
        :class:`CoordinatorUnavailable` when the stream cannot start or breaks
        (etcd stopped): the caller re-lists and watches again.
        """
        request = {
            "create_request": {
                "key": b64(prefix),
                "range_end": b64(prefix_end(prefix)),
                "start_revision": str(start_revision),
                "progress_notify": progress_notify,
            }
        }
        # No read deadline: a quiet prefix sends nothing for minutes; a dead etcd closes the
        # connection, which ends the stream.
        timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout, sock_connect=self.timeout)
        failures = []
        for index, endpoint in self._ordered_endpoints():
            try:
                response = await self._http().post(
                    f"{self.tls.url(endpoint)}{API_PREFIX}/watch",
                    json=request,
                    timeout=timeout,
                    ssl=self.tls.ssl_context or True,
                )
            except (TimeoutError, aiohttp.ClientError) as error:
                failures.append(f"{endpoint}: {error or type(error).__name__}")
                continue
            self._preferred = index
            async with response:
                if response.status >= 400:
                    raise_for_answer(endpoint, response.status, await response.json())
                async for batch in _watch_batches(endpoint, response):
                    yield batch
            raise CoordinatorUnavailable(f"the watch stream from etcd at {endpoint} ended")
        raise CoordinatorUnavailable(f"no etcd endpoint answered ({'; '.join(failures)})")


async def _watch_batches(
    endpoint: str, response: aiohttp.ClientResponse
) -> AsyncIterator[WatchBatch]:
    """The gateway streams one JSON object a line: ``{"result": WatchResponse}``."""
    buffer = b""
    try:
        async for chunk in response.content.iter_any():
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    yield _watch_batch(endpoint, json.loads(line))
    except (TimeoutError, aiohttp.ClientError) as error:
        raise CoordinatorUnavailable(
            f"the watch stream from etcd at {endpoint} broke: {error}"
        ) from error


def _watch_batch(endpoint: str, message: dict[str, Any]) -> WatchBatch:
    if "result" not in message:
        raise_for_answer(endpoint, 500, message)
        raise CoordinatorUnavailable(f"etcd at {endpoint} sent {message!r} on a watch")
    result = message["result"]
    compact_revision = int(result.get("compact_revision", 0))
    if compact_revision:
        raise WatchCompacted(compact_revision)
    if result.get("canceled"):
        raise CoordinatorUnavailable(
            f"etcd at {endpoint} cancelled a watch: {result.get('cancel_reason', 'no reason')}"
        )
    events = [
        WatchEvent(event.get("type", "PUT"), key_value(event["kv"]))
        for event in result.get("events", [])
    ]
    return WatchBatch(header_revision(result), events)
