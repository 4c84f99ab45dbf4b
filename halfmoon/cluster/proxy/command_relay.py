"""Client commands relayed through etcd to the proxy worker that holds the client's stream.

A client's telemetry stream lives on one proxy worker, but an admin request
(``message get ID --group G --client C``: consumeMessageDirectly) reaches
whichever worker of whichever proxy the kernel or the operator picked. The
worker that got it finds the owner in the session directory
(:mod:`halfmoon.cluster.proxy.session_directory`: ``<proxy>/<pid>``) and relays:

1. it grants a lease of ``timeout + FORWARD_MARGIN_S`` (at least etcd's
   minimum) and writes the request under it, at
   ``/halfmoon-commands/<cluster>/<proxy>/<pid>/<nonce>``;
2. the owner, which watches its own ``.../<proxy>/<pid>/`` prefix, runs the
   command on the client's stream and writes the outcome (the client's
   answer, or an error with its stable code) at
   ``/halfmoon-replies/<cluster>/<nonce>``, under the requester's lease;
3. the requester, watching the reply key from the revision of its request,
   returns the answer or re-raises the error, and revokes the lease, which
   deletes both keys. A requester that dies leaves them to the lease.

The requester waits ``timeout + FORWARD_MARGIN_S`` in all: the client's own
deadline runs on the owner, the margin pays for two etcd round trips and the
owner's read of the message. A silent owner (killed, hung, cut from etcd)
ends in :class:`WorkerDidNotAnswer`.

Both prefixes live beside the cluster's keys, not under them, so a relayed
command wakes no proxy or broker watching the cluster (as the session
directory does); requests and replies have prefixes of their own so the
owner's watch sees requests only. The request names the message by id and
topic, not by its bytes: a body may be larger (``broker.max_body_size``, 4 MiB)
than etcd takes in one request (1.5 MiB by default), and the owner reads the
message from the brokers as the requester did. The owner trusts etcd: the
requester authorized the admin caller, and only cluster members write there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from halfmoon.cluster.coordination.etcd import EtcdClient, KeyValue, WatchBatch
from halfmoon.cluster.coordination.etcd_json import EtcdRequestError
from halfmoon.cluster.coordination.follow import follow_prefix
from halfmoon.cluster.coordination.keys import ROOT, check_name
from halfmoon.cluster.errors import CoordinatorUnavailable
from halfmoon.errors import HalfmoonError
from halfmoon.server.client_commands import ClientAnswer, ClientDidNotAnswer, ClientNotConnected

log = logging.getLogger("halfmoon.cluster")

COMMANDS_ROOT = ROOT.rstrip("/") + "-commands/"
REPLIES_ROOT = ROOT.rstrip("/") + "-replies/"
# What the requester waits beyond the client's own deadline: etcd writes and watch
# deliveries (milliseconds each) and the owner's read of the message from a broker.
FORWARD_MARGIN_S = 3.0
MIN_LEASE_TTL_S = 2  # etcd refuses shorter leases
_ETCD_FAILURES = (HalfmoonError, EtcdRequestError, OSError, TimeoutError)


class WorkerDidNotAnswer(HalfmoonError):
    """The proxy worker holding the client did not answer a relayed command in time."""

    code = "PROXY_WORKER_DID_NOT_ANSWER"
    protocol_code = "PROXY_TIMEOUT"
    http_status = 500


class RelayedError(HalfmoonError):
    """An error the owning worker raised, carried back with its code and statuses."""

    def __init__(self, message: str, *, code: str, protocol_code: str, http_status: int) -> None:
        super().__init__(message, code=code)
        self.protocol_code = protocol_code
        self.http_status = http_status


# Errors re-raised as their own class, so callers catching them see no difference.
_KNOWN: dict[str, type[HalfmoonError]] = {
    ClientNotConnected.code: ClientNotConnected,
    ClientDidNotAnswer.code: ClientDidNotAnswer,
}


@dataclass(frozen=True)
class VerifyRequest:
    """consumeMessageDirectly for ``client_id`` of ``group``, on message ``message_id``."""

    client_id: str
    group: str
    message_id: str
    topic: str
    timeout_s: float

    @classmethod
    def from_json(cls, data: Any) -> VerifyRequest:
        return cls(
            str(data["client_id"]),
            str(data["group"]),
            str(data["message_id"]),
            str(data["topic"]),
            float(data["timeout_s"]),
        )


# Runs a request on this worker's client streams (halfmoon.server.direct_consume).
Execute = Callable[[VerifyRequest], Awaitable[ClientAnswer]]


def commands_prefix(cluster: str, worker: str) -> str:
    """Where requests for ``worker`` (``<proxy>/<pid>``, as the session directory names it)
    are written; the worker's name is checked, since it is read back from etcd."""
    proxy, _, pid = worker.partition("/")
    if not pid.isdigit():
        raise ValueError(f"{worker!r} is not a proxy worker (<proxy>/<pid>)")
    return f"{COMMANDS_ROOT}{check_name('cluster', cluster)}/{check_name('proxy', proxy)}/{pid}/"


def reply_key(cluster: str, nonce: str) -> str:
    return f"{REPLIES_ROOT}{check_name('cluster', cluster)}/{nonce}"


class CommandRelay:
    """Relays requests to other workers (:meth:`forward`) and runs those sent to this one."""

    def __init__(self, client: EtcdClient, cluster: str, worker: str, execute: Execute) -> None:
        self._client = client
        self._cluster = cluster
        self._execute = execute
        self.worker = worker
        self.prefix = commands_prefix(cluster, worker)
        self._task: asyncio.Task[None] | None = None
        self._running: dict[str, asyncio.Task[None]] = {}  # by request key
        # Requests run (or running) whose key still exists: a re-list after a broken watch
        # lists them again, and each must run once.
        self._seen: set[str] = set()

    # -- the requester ------------------------------------------------------------------

    async def forward(self, worker: str, request: VerifyRequest) -> ClientAnswer:
        """Have ``worker`` run ``request`` and return its answer (or raise its error)."""
        nonce = uuid.uuid4().hex
        key = commands_prefix(self._cluster, worker) + nonce
        wait_s = request.timeout_s + FORWARD_MARGIN_S
        lease = await self._client.grant_lease(max(MIN_LEASE_TTL_S, math.ceil(wait_s) + 1))
        deadline = asyncio.timeout(wait_s)
        try:
            async with deadline:
                payload = {**asdict(request), "lease": lease}
                revision = await self._client.put(key, json.dumps(payload).encode(), lease=lease)
                outcome = await self._reply(reply_key(self._cluster, nonce), revision)
        except TimeoutError:
            if not deadline.expired():
                raise
            raise WorkerDidNotAnswer(
                f"proxy worker {worker} holds client {request.client_id!r} but did not answer "
                f"within {wait_s:g} s; it may have stopped (its clients stay listed until its "
                "lease runs out) or lost etcd"
            ) from None
        finally:
            with contextlib.suppress(*_ETCD_FAILURES):
                await self._client.revoke_lease(lease)  # the request and reply go with it
        return _answer(request.client_id, outcome)

    async def _reply(self, key: str, revision: int) -> dict[str, Any]:
        # From the request's revision on: a reply written before the watch is in place is
        # still delivered.
        watch = self._client.watch_prefix(key, revision, progress_notify=False)
        async with contextlib.aclosing(watch):
            async for batch in watch:
                for event in batch.events:
                    if event.kind == "PUT" and event.kv.key == key:
                        outcome = json.loads(event.kv.value)
                        if isinstance(outcome, dict):
                            return outcome
        raise CoordinatorUnavailable("the watch of a relayed command's reply ended")

    # -- the owner ----------------------------------------------------------------------

    async def start(self) -> None:
        """Run the requests sent to this worker, from now until :meth:`stop`."""
        self._task = asyncio.create_task(self._follow(), name="command relay")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._running.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _follow(self) -> None:
        """List pending requests, watch for new ones; afresh after any interruption."""
        await follow_prefix(
            self._client,
            self.prefix,
            what="command relay",
            listed=self._listed,
            changed=self._changed_batch,
        )

    async def _listed(self, kvs: list[KeyValue], revision: int) -> None:
        self._seen &= {kv.key for kv in kvs}  # the others were deleted meanwhile
        for kv in kvs:
            self._accept(kv.key, kv.value)

    async def _changed_batch(self, batch: WatchBatch) -> None:
        for event in batch.events:
            if event.kind == "DELETE":
                self._seen.discard(event.kv.key)
            else:
                self._accept(event.kv.key, event.kv.value)

    def _accept(self, key: str, value: bytes) -> None:
        if key in self._seen:
            return
        self._seen.add(key)
        task = asyncio.create_task(self._run(key, value), name=f"relayed {key}")
        self._running[key] = task
        task.add_done_callback(lambda _: self._running.pop(key, None))

    async def _run(self, key: str, value: bytes) -> None:
        started = time.monotonic()
        try:
            data = json.loads(value)
            lease = int(data["lease"])
            request = VerifyRequest.from_json(data)
        except (ValueError, KeyError, TypeError) as error:
            log.warning("event=relayed_command_unreadable key=%s error=%s", key, error)
            return
        nonce = key.rsplit("/", 1)[1]
        try:
            answer = await self._execute(request)
            outcome: dict[str, Any] = {"code": answer.code, "message": answer.message}
        except HalfmoonError as error:
            outcome = {
                "error": {
                    "code": error.code,
                    "protocol_code": error.protocol_code,
                    "http_status": error.http_status,
                    "message": error.message,
                }
            }
        except Exception as error:  # a bug: the requester gets an error rather than a wait
            log.exception("event=relayed_command_failed key=%s", key)
            outcome = {"error": {"code": "INTERNAL_ERROR", "message": repr(error)}}
        try:
            await self._client.put(
                reply_key(self._cluster, nonce), json.dumps(outcome).encode(), lease=lease
            )
        except _ETCD_FAILURES as error:
            # Most often the requester gave up and revoked its lease: nobody waits.
            log.warning("event=relayed_reply_failed key=%s error=%s", key, error)
            return
        log.info(
            "event=relayed_command worker=%s client_id=%s outcome=%s elapsed_ms=%d",
            self.worker,
            request.client_id,
            outcome.get("code") or outcome["error"]["code"],
            (time.monotonic() - started) * 1000,
        )


def _answer(client_id: str, outcome: dict[str, Any]) -> ClientAnswer:
    """The owner's outcome as the local call would have ended: an answer, or its error."""
    error = outcome.get("error")
    if isinstance(error, dict):
        code, message = str(error.get("code")), str(error.get("message"))
        known = _KNOWN.get(code)
        if known is not None:
            raise known(message)
        raise RelayedError(
            message,
            code=code,
            protocol_code=str(error.get("protocol_code") or "INTERNAL_ERROR"),
            http_status=int(error.get("http_status") or 500),
        )
    return ClientAnswer(client_id, str(outcome.get("code")), str(outcome.get("message", "")))
