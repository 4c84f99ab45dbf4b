"""Exchanges, queues and bindings per vhost: declared, compared, deleted, routed through.

This is metadata only: the messages of a queue live in its halfmoon topic
(:mod:`halfmoon.amqp.names`), created and deleted through the broker facade
by the channel. Every vhost starts with the default exchange (``""``, direct,
every queue bound by its name) and the ``amq.*`` set. Durable entities and
the bindings between them are written to ``metadata/amqp.json`` in the data
directory on each change (atomically), and read back when the server starts;
transient ones (and exclusive queues) end with the process.

Where the topology is kept is a :class:`TopologyStore`'s business:
:class:`LocalTopologyStore` writes the data directory (``halfmoon serve``);
a cluster proxy's store keeps it in etcd for every proxy
(:mod:`halfmoon.cluster.coordination.amqp_topology`).

Rules follow the spec and RabbitMQ: a redeclare with other type, flags or
arguments is 406 PRECONDITION_FAILED; names beginning ``amq.`` are reserved
(403); the default exchange cannot be declared (even passively), bound, unbound
or deleted (403); an exclusive queue is its connection's alone, and a redeclare
that differs in exclusivity is refused (405 RESOURCE_LOCKED); routing
follows exchange-to-exchange bindings once per exchange (cycles end).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from halfmoon.amqp.exchange import TYPES, Matcher
from halfmoon.amqp.names import stored_name
from halfmoon.amqp.reply_codes import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    AmqpChannelError,
    AmqpConnectionError,
)
from halfmoon.broker.config import read_json, write_json_atomic

log = logging.getLogger("halfmoon.amqp")

FILE_NAME = "amqp.json"
_BUILTIN = {
    "": "direct",
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
}
_DEFAULT_EXCHANGE_REFUSED = "operation not permitted on the default exchange"


def plain(value: Any) -> Any:
    """A field-table value as JSON (bytes, decimals and timestamps tagged), for storage
    and for comparing arguments."""
    if isinstance(value, bytes):
        return {"$b": base64.b64encode(value).decode()}
    if isinstance(value, decimal.Decimal):
        return {"$d": str(value)}
    if isinstance(value, datetime.datetime):
        return {"$t": value.timestamp()}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def unplain(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$b"}:
            return base64.b64decode(value["$b"])
        if set(value) == {"$d"}:
            return decimal.Decimal(value["$d"])
        if set(value) == {"$t"}:
            return datetime.datetime.fromtimestamp(value["$t"], tz=datetime.UTC)
        return {k: _unplain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unplain(v) for v in value]
    return value


_plain, _unplain = plain, unplain

DELAYED = "x-delayed-message"  # RabbitMQ's delayed-message exchange: routes as x-delayed-type


def matcher_of(exchange: Exchange) -> Matcher | None:
    kind = exchange.type
    if kind == DELAYED:
        kind = exchange.arguments.get("x-delayed-type", "")
        if isinstance(kind, bytes):
            kind = kind.decode(errors="replace")
    return TYPES.get(kind) if isinstance(kind, str) else None


@dataclass
class Exchange:
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)

    def same(self, other: Exchange) -> bool:
        return (self.type, self.durable, self.auto_delete, self.internal) == (
            other.type,
            other.durable,
            other.auto_delete,
            other.internal,
        ) and _plain(self.arguments) == _plain(other.arguments)


@dataclass
class Queue:
    name: str
    stored: str  # the halfmoon topic and consumer group holding it
    durable: bool = True
    exclusive_owner: str | None = None  # the connection that owns an exclusive queue
    auto_delete: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    consumers: int = 0  # live consumers (auto-delete: deleted when the last one goes)
    # When it was last declared, consumed from or read by Basic.Get (time.monotonic(); for
    # x-expires, halfmoon.amqp.housekeeping).
    last_used: float = field(default_factory=time.monotonic)

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def same(self, durable: bool, exclusive: bool, auto_delete: bool, arguments: Any) -> bool:
        return (
            self.durable == durable
            and (self.exclusive_owner is not None) == exclusive
            and self.auto_delete == auto_delete
            and _plain(self.arguments) == _plain(arguments or {})
        )


@dataclass(frozen=True)
class Binding:
    source: str
    destination: str
    to_exchange: bool  # destination is an exchange (exchange-to-exchange binding)
    routing_key: str
    arguments_json: str  # canonical, so equal arguments make equal bindings

    @property
    def arguments(self) -> dict[str, Any]:
        loaded: dict[str, Any] = _unplain(json.loads(self.arguments_json))
        return loaded


def binding_of(
    source: str, destination: str, to_exchange: bool, routing_key: str, arguments: Any
) -> Binding:
    canonical = json.dumps(_plain(arguments or {}), sort_keys=True)
    return Binding(source, destination, to_exchange, routing_key, canonical)


class VHost:
    def __init__(self, name: str, namespace: str) -> None:
        self.name = name
        self.namespace = namespace
        self.exchanges: dict[str, Exchange] = {n: Exchange(n, t) for n, t in _BUILTIN.items()}
        self.queues: dict[str, Queue] = {}
        self.bindings: set[Binding] = set()

    def _where(self) -> str:
        return f"in vhost {self.name!r}"

    # -- exchanges -------------------------------------------------------------

    def exchange(self, name: str) -> Exchange:
        found = self.exchanges.get(name)
        if found is None:
            raise AmqpChannelError(NOT_FOUND, f"no exchange {name!r} {self._where()}", 40, 10)
        return found

    def declare_exchange(self, wanted: Exchange, passive: bool) -> Exchange:
        if wanted.name == "":
            # Even passively, as RabbitMQ refuses it (aiormq's tests check the 403).
            raise AmqpChannelError(ACCESS_REFUSED, _DEFAULT_EXCHANGE_REFUSED, 40, 10)
        found = self.exchanges.get(wanted.name)
        if passive:
            if found is None:
                raise AmqpChannelError(
                    NOT_FOUND, f"no exchange {wanted.name!r} {self._where()}", 40, 10
                )
            return found
        if matcher_of(wanted) is None:
            raise AmqpConnectionError(
                COMMAND_INVALID,
                f"unknown exchange type {wanted.type!r}: use direct, fanout, topic, headers or "
                "x-delayed-message (with x-delayed-type one of those)",
                40,
                10,
            )
        if found is not None:
            if not found.same(wanted):
                raise AmqpChannelError(
                    PRECONDITION_FAILED,
                    f"inequivalent arg for exchange {wanted.name!r} {self._where()}: declared "
                    f"as type {found.type!r}, durable={found.durable}, auto_delete="
                    f"{found.auto_delete}, internal={found.internal}, arguments "
                    f"{_plain(found.arguments)}; declare it the same way or delete it first",
                    40,
                    10,
                )
            return found
        if wanted.name.startswith("amq."):
            raise AmqpChannelError(
                ACCESS_REFUSED,
                f"exchange name {wanted.name!r} contains reserved prefix 'amq.*'",
                40,
                10,
            )
        self.exchanges[wanted.name] = wanted
        return wanted

    def delete_exchange(self, name: str, if_unused: bool) -> bool:
        """Whether there was an exchange to delete: deleting a missing one is no error, as in
        RabbitMQ (a client's cleanup may delete what a test already deleted)."""
        if name == "":
            raise AmqpChannelError(ACCESS_REFUSED, _DEFAULT_EXCHANGE_REFUSED, 40, 20)
        if name in _BUILTIN:
            raise AmqpChannelError(
                ACCESS_REFUSED, f"exchange {name!r} is built in and cannot be deleted", 40, 20
            )
        if name not in self.exchanges:
            return False
        if if_unused and any(b.source == name for b in self.bindings):
            raise AmqpChannelError(
                PRECONDITION_FAILED, f"exchange {name!r} {self._where()} in use", 40, 20
            )
        del self.exchanges[name]
        self.bindings = {
            b
            for b in self.bindings
            if b.source != name and not (b.to_exchange and b.destination == name)
        }
        return True

    # -- queues ----------------------------------------------------------------

    def queue(self, name: str, owner: str, class_method: tuple[int, int] = (50, 10)) -> Queue:
        found = self.queues.get(name)
        if found is None:
            raise AmqpChannelError(NOT_FOUND, f"no queue {name!r} {self._where()}", *class_method)
        if found.exclusive_owner is not None and found.exclusive_owner != owner:
            raise AmqpChannelError(
                RESOURCE_LOCKED,
                f"cannot obtain exclusive access to locked queue {name!r} {self._where()}: "
                "another connection declared it exclusive",
                *class_method,
            )
        return found

    def declare_queue(
        self,
        name: str,
        owner: str,
        *,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: dict[str, Any],
    ) -> tuple[Queue, bool]:
        """The queue and whether it is new (the caller then creates its topic and group)."""
        if passive:
            return self.queue(name, owner), False
        found = self.queues.get(name)
        if found is not None:
            self.queue(name, owner)  # another connection's exclusive queue
            if (found.exclusive_owner is not None) != exclusive:
                # RabbitMQ's answer (405, not 406) to a redeclare that differs only there.
                raise AmqpChannelError(
                    RESOURCE_LOCKED,
                    f"cannot obtain exclusive access to locked queue {name!r} {self._where()}: "
                    "the exclusive property value does not match that of the original "
                    "declaration",
                    50,
                    10,
                )
            if not found.same(durable, exclusive, auto_delete, arguments):
                raise AmqpChannelError(
                    PRECONDITION_FAILED,
                    f"inequivalent arg for queue {name!r} {self._where()}: declared as "
                    f"durable={found.durable}, exclusive={found.exclusive_owner is not None}, "
                    f"auto_delete={found.auto_delete}, arguments {_plain(found.arguments)}; "
                    "declare it the same way or delete it first",
                    50,
                    10,
                )
            return found, False
        if name.startswith("amq.") and not name.startswith("amq.gen-"):
            raise AmqpChannelError(
                ACCESS_REFUSED, f"queue name {name!r} contains reserved prefix 'amq.*'", 50, 10
            )
        queue = Queue(
            name,
            stored_name(self.namespace, name),
            durable=durable,
            exclusive_owner=owner if exclusive else None,
            auto_delete=auto_delete,
            arguments=dict(arguments),
        )
        self.queues[name] = queue
        return queue, True

    def remove_queue(self, name: str) -> Queue | None:
        queue = self.queues.pop(name, None)
        self.bindings = {b for b in self.bindings if b.to_exchange or b.destination != name}
        return queue

    # -- bindings --------------------------------------------------------------

    def bind(
        self,
        source: str,
        destination: str,
        to_exchange: bool,
        routing_key: str,
        arguments: Any,
        owner: str,
        unbind: bool = False,
    ) -> None:
        class_method = (40, 40 if unbind else 30) if to_exchange else (50, 50 if unbind else 20)
        if source == "":
            raise AmqpChannelError(
                ACCESS_REFUSED,
                f"{_DEFAULT_EXCHANGE_REFUSED}: every queue is bound to it by its name already",
                *class_method,
            )
        targets: Mapping[str, object] = self.exchanges if to_exchange else self.queues
        if unbind and (source not in self.exchanges or destination not in targets):
            # Unbinding from or to what is not there is done, as RabbitMQ answers it: an
            # auto-delete queue goes with its last consumer, and aio-pika's RPC unbinds
            # its result queue after cancelling that consumer.
            return
        if source not in self.exchanges:
            raise AmqpChannelError(
                NOT_FOUND, f"no exchange {source!r} {self._where()}", *class_method
            )
        if to_exchange:
            if destination not in self.exchanges:
                raise AmqpChannelError(
                    NOT_FOUND, f"no exchange {destination!r} {self._where()}", *class_method
                )
        else:
            self.queue(destination, owner, class_method)
        binding = binding_of(source, destination, to_exchange, routing_key, arguments)
        if unbind:
            self.bindings.discard(binding)
        else:
            self.bindings.add(binding)

    # -- routing -----------------------------------------------------------------

    def route(
        self,
        exchange: str,
        routing_key: str,
        headers: Mapping[str, Any],
        dead_letter: bool = False,
    ) -> list[Queue]:
        """The queues a message published to ``exchange`` with ``routing_key`` reaches (a
        ``dead_letter`` copy may enter through an internal exchange, as in RabbitMQ)."""
        if exchange == "":
            queue = self.queues.get(routing_key)
            return [queue] if queue is not None else []
        start = self.exchanges.get(exchange)
        if start is None:
            raise AmqpChannelError(NOT_FOUND, f"no exchange {exchange!r} {self._where()}", 60, 40)
        if start.internal and not dead_letter:
            raise AmqpChannelError(
                ACCESS_REFUSED,
                f"cannot publish to internal exchange {exchange!r} {self._where()}",
                60,
                40,
            )
        seen_exchanges = {exchange}
        pending = [start]
        found: dict[str, Queue] = {}
        while pending:
            current = pending.pop()
            match = matcher_of(current)
            if match is None:
                continue
            for b in self.bindings:
                if b.source != current.name:
                    continue
                if not match(b.routing_key, b.arguments, routing_key, headers):
                    continue
                if b.to_exchange:
                    nxt = self.exchanges.get(b.destination)
                    if nxt is not None and nxt.name not in seen_exchanges:
                        seen_exchanges.add(nxt.name)
                        pending.append(nxt)
                else:
                    queue = self.queues.get(b.destination)
                    if queue is not None:
                        found[queue.name] = queue
        return list(found.values())

    # -- persistence -------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        durable_exchanges = {
            n for n, e in self.exchanges.items() if e.durable and n not in _BUILTIN
        }
        durable_queues = {
            n for n, q in self.queues.items() if q.durable and q.exclusive_owner is None
        }
        return {
            "namespace": self.namespace,
            "exchanges": [
                {
                    "name": e.name,
                    "type": e.type,
                    "auto_delete": e.auto_delete,
                    "internal": e.internal,
                    "arguments": _plain(e.arguments),
                }
                for n, e in sorted(self.exchanges.items())
                if n in durable_exchanges
            ],
            "queues": [
                {
                    "name": q.name,
                    "stored": q.stored,
                    "auto_delete": q.auto_delete,
                    "arguments": _plain(q.arguments),
                }
                for n, q in sorted(self.queues.items())
                if n in durable_queues
            ],
            "bindings": [
                {
                    "source": b.source,
                    "destination": b.destination,
                    "to_exchange": b.to_exchange,
                    "routing_key": b.routing_key,
                    "arguments": json.loads(b.arguments_json),
                }
                for b in sorted(
                    self.bindings, key=lambda b: (b.source, b.destination, b.routing_key)
                )
                if (b.source in durable_exchanges or b.source in _BUILTIN)
                and (
                    b.destination in (durable_exchanges | set(_BUILTIN))
                    if b.to_exchange
                    else b.destination in durable_queues
                )
            ],
        }

    def load(self, data: Mapping[str, Any]) -> None:
        for e in data.get("exchanges", []):
            self.exchanges[e["name"]] = Exchange(
                e["name"],
                e["type"],
                True,
                e["auto_delete"],
                e["internal"],
                _unplain(e["arguments"]),
            )
        for q in data.get("queues", []):
            self.queues[q["name"]] = Queue(
                q["name"], q["stored"], True, None, q["auto_delete"], _unplain(q["arguments"])
            )
        for b in data.get("bindings", []):
            self.bindings.add(
                binding_of(
                    b["source"],
                    b["destination"],
                    b["to_exchange"],
                    b["routing_key"],
                    _unplain(b["arguments"]),
                )
            )


class TopologyStore(Protocol):
    """Where a :class:`Topology` is kept between changes, and how others' changes reach it."""

    # Whether other processes serve the same topology (then each sees only its own use).
    shared: bool

    async def open(self, topology: Topology) -> None:
        """Fill ``topology`` with what is stored (and start following changes made elsewhere)."""

    async def save(self, topology: Topology) -> None:
        """Store ``topology`` as it is now (raises :class:`AmqpChannelError` when another
        writer declared the same entity differently at the same time)."""

    async def catch_up(self, topology: Topology, vhost: VHost) -> bool:
        """Bring ``vhost`` up to what the store holds now; whether anything changed."""

    async def close(self) -> None:
        """Stop following."""


class LocalTopologyStore:
    """The durable part of the topology in one JSON file (None: memory only); one process
    writes it, so there is nothing to follow."""

    shared = False

    def __init__(self, path: Path | None) -> None:
        self._path = path

    async def open(self, topology: Topology) -> None:
        if self._path is None:
            return
        data = read_json(self._path) or {}
        for name, vhost_data in data.get("vhosts", {}).items():
            vhost = VHost(name, vhost_data["namespace"])
            vhost.load(vhost_data)
            topology.vhosts[name] = vhost

    async def save(self, topology: Topology) -> None:
        if self._path is None:
            return
        write_json_atomic(
            self._path, {"vhosts": {n: v.to_json() for n, v in sorted(topology.vhosts.items())}}
        )

    async def catch_up(self, topology: Topology, vhost: VHost) -> bool:
        return False  # nobody else writes it

    async def close(self) -> None:
        return None


class Topology:
    """Every vhost's exchanges, queues and bindings, kept by ``store`` (default: memory)."""

    def __init__(self, store: TopologyStore | None = None) -> None:
        self.store: TopologyStore = store if store is not None else LocalTopologyStore(None)
        self.vhosts: dict[str, VHost] = {}
        # Told when a store learns that a queue went elsewhere (its consumers here end).
        self.on_queue_gone: Callable[[VHost, Queue], None] = lambda vhost, queue: None

    @property
    def shared(self) -> bool:
        return self.store.shared

    async def open(self) -> None:
        await self.store.open(self)

    async def close(self) -> None:
        await self.store.close()

    def vhost(self, name: str, namespace: str) -> VHost:
        found = self.vhosts.get(name)
        if found is None:
            found = self.vhosts[name] = VHost(name, namespace)
        return found

    async def save(self) -> None:
        await self.store.save(self)

    async def catch_up(self, vhost: VHost) -> bool:
        """Read what other proxies changed in ``vhost`` now, rather than when it is heard of
        (cluster mode); whether anything changed."""
        return await self.store.catch_up(self, vhost)
