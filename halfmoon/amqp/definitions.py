"""The AMQP topology as definitions: exported and imported in RabbitMQ's shape.

    "vhosts":    [{"name": "/"}]
    "exchanges": [{"name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"}]
    "queues":    [{"name", "vhost", "durable", "auto_delete", "arguments"}]
    "bindings":  [{"source", "vhost", "destination", "destination_type", "routing_key",
                   "arguments"}]

as ``rabbitmqctl export_definitions`` writes them (``destination_type`` is ``queue`` or
``exchange``). Exported is what outlives a restart: durable exchanges other than the
built-in ones, durable queues that are not exclusive, and the bindings between them; the
default exchange's bindings are implicit, no entries, as in RabbitMQ. Argument values JSON
cannot carry (bytes, decimals, timestamps) are tagged as in ``metadata/amqp.json``.

An import goes through the rules a channel's Exchange.Declare, Queue.Declare and Bind go
through (known exchange types, reserved ``amq.*`` names, a redeclare with other properties
refused, the queue arguments' checks, a binding's ends must exist), first on a copy of
each vhost, so a document that breaks any rule changes nothing; then on the topology
itself, creating each new queue's topic and group, and saving once. What is already
declared the same way is ``unchanged``, so a second import changes nothing. An import
never deletes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from halfmoon.amqp import queue_arguments
from halfmoon.amqp.message import max_priority
from halfmoon.amqp.names import DEFAULT_VHOST, check_name, namespace_of
from halfmoon.amqp.reply_codes import AmqpError
from halfmoon.amqp.topology import Exchange, Topology, VHost, binding_of, unplain
from halfmoon.errors import InvalidArgument

if TYPE_CHECKING:
    from halfmoon.amqp.server import AmqpServer

KINDS = ("vhosts", "exchanges", "queues", "bindings")
_FIELDS = {
    "vhosts": {"name"},
    "exchanges": {"name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"},
    "queues": {"name", "vhost", "durable", "auto_delete", "arguments"},
    "bindings": {
        "source", "vhost", "destination", "destination_type", "routing_key", "arguments",
    },
}  # fmt: skip
_OWNER = "definitions import"  # stands for a connection: never exclusive, so owns nothing


def export(topology: Topology) -> dict[str, list[dict[str, Any]]]:
    document: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for name, vhost in sorted(topology.vhosts.items()):
        document["vhosts"].append({"name": name})
        kept = vhost.to_json()  # the durable part, as the store keeps it
        for e in kept["exchanges"]:
            document["exchanges"].append(
                {"name": e["name"], "vhost": name, "type": e["type"], "durable": True,
                 "auto_delete": e["auto_delete"], "internal": e["internal"],
                 "arguments": e["arguments"]}
            )  # fmt: skip
        for q in kept["queues"]:
            document["queues"].append(
                {"name": q["name"], "vhost": name, "durable": True,
                 "auto_delete": q["auto_delete"], "arguments": q["arguments"]}
            )  # fmt: skip
        for b in kept["bindings"]:
            if b["source"] == "":
                continue
            document["bindings"].append(
                {"source": b["source"], "vhost": name, "destination": b["destination"],
                 "destination_type": "exchange" if b["to_exchange"] else "queue",
                 "routing_key": b["routing_key"], "arguments": b["arguments"]}
            )  # fmt: skip
    return document


def stored_names(topology: Topology) -> set[str]:
    """The topics and groups that hold queues: the queues' definitions stand for them."""
    return {q.stored for vhost in topology.vhosts.values() for q in vhost.queues.values()}


@dataclass(frozen=True)
class Step:
    """One entry of an import: what it declares, where, and whether it is new."""

    kind: str
    vhost: str
    name: str
    created: bool
    entry: dict[str, Any]

    @property
    def shown(self) -> str:
        return self.name if self.vhost == DEFAULT_VHOST else f"{self.vhost}:{self.name}"


def has_entries(document: dict[str, Any]) -> bool:
    return any(document.get(kind) for kind in KINDS)


async def plan(topology: Topology, document: dict[str, Any]) -> list[Step]:
    """Every entry of the document checked against the declare rules on a copy of its
    vhost, in order (vhosts, exchanges, queues, bindings); InvalidArgument for the first
    that breaks one, naming it."""
    scratch: dict[str, VHost] = {}

    async def vhost_copy(name: object, where: str) -> VHost:
        if not isinstance(name, str):
            raise InvalidArgument(f"{where}: 'vhost' must be a string")
        if name not in scratch:
            try:
                namespace = namespace_of(name)
            except AmqpError as exc:
                raise InvalidArgument(f"{where}: {exc.text}") from None
            current = topology.vhosts.get(name)
            if current is None and topology.shared:
                # Another proxy of the cluster may hold it: the store reads it in.
                current = topology.vhost(name, namespace)
            if current is not None:
                await topology.catch_up(current)  # other proxies' changes, now
            scratch[name] = copy.deepcopy(current) if current else VHost(name, namespace)
        return scratch[name]

    steps: list[Step] = []
    for kind in KINDS:
        entries = document.get(kind, [])
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise InvalidArgument(f"'{kind}' must be an array of objects")
        for index, entry in enumerate(entries):
            where = f"{kind}[{index}]"
            extra = sorted(set(entry) - _FIELDS[kind])
            if extra:
                raise InvalidArgument(f"{where}: unknown field {extra[0]!r}")
            if kind == "vhosts":
                name = entry.get("name")
                known = name in topology.vhosts
                await vhost_copy(name, where)
                steps.append(Step(kind, str(name), str(name), not known, entry))
                continue
            vhost = await vhost_copy(entry.get("vhost", DEFAULT_VHOST), where)
            try:
                steps.append(_declare(kind, vhost, entry, where))
            except AmqpError as exc:
                raise InvalidArgument(f"{where}: {exc.reply_text}") from None
    return steps


def _text(entry: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str):
        raise InvalidArgument(f"{where}: '{key}' must be a string")
    return value


def _flag(entry: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = entry.get(key, default)
    if not isinstance(value, bool):
        raise InvalidArgument(f"{where}: '{key}' must be true or false")
    return value


def _arguments(entry: dict[str, Any], where: str) -> dict[str, Any]:
    value = entry.get("arguments", {})
    if not isinstance(value, dict):
        raise InvalidArgument(f"{where}: 'arguments' must be an object")
    arguments: dict[str, Any] = unplain(value)
    return arguments


def _declare(kind: str, vhost: VHost, entry: dict[str, Any], where: str) -> Step:
    """Declare ``entry`` on ``vhost`` (a copy) as a channel would; the step it makes."""
    arguments = _arguments(entry, where)
    if kind == "exchanges":
        name = check_name(_text(entry, "name", where), "exchange")
        wanted = Exchange(
            name,
            _text(entry, "type", where),
            _flag(entry, "durable", where, True),
            _flag(entry, "auto_delete", where, False),
            _flag(entry, "internal", where, False),
            arguments,
        )
        created = name not in vhost.exchanges
        vhost.declare_exchange(wanted, passive=False)
        return Step(kind, vhost.name, name, created, entry)
    if kind == "queues":
        name = check_name(_text(entry, "name", where), "queue")
        if not name:
            raise InvalidArgument(f"{where}: a queue needs a name (the server names none here)")
        queue_arguments.check(name, arguments)
        _, created = vhost.declare_queue(
            name,
            _OWNER,
            passive=False,
            durable=_flag(entry, "durable", where, True),
            exclusive=False,
            auto_delete=_flag(entry, "auto_delete", where, False),
            arguments=arguments,
        )
        return Step(kind, vhost.name, name, created, entry)
    source = _text(entry, "source", where)
    destination = _text(entry, "destination", where)
    destination_type = _text(entry, "destination_type", where, "queue")
    if destination_type not in ("queue", "exchange"):
        raise InvalidArgument(f"{where}: 'destination_type' must be queue or exchange")
    to_exchange = destination_type == "exchange"
    routing_key = _text(entry, "routing_key", where, "")
    binding = binding_of(source, destination, to_exchange, routing_key, arguments)
    created = binding not in vhost.bindings
    vhost.bind(source, destination, to_exchange, routing_key, arguments, _OWNER)
    name = f"{source} -> {destination_type} {destination} ({routing_key!r})"
    return Step(kind, vhost.name, name, created, entry)


async def apply(server: AmqpServer, steps: list[Step]) -> None:
    """Declare what ``plan`` found new, on the topology itself; save it once."""
    topology = server.topology
    for step in steps:
        if not step.created:
            continue
        vhost = topology.vhost(step.vhost, namespace_of(step.vhost))
        if step.kind == "vhosts":
            continue
        where = f"{step.kind} {step.shown!r}"
        before = set(vhost.queues)
        _declare(step.kind, vhost, step.entry, where)
        for name in set(vhost.queues) - before:
            queue = vhost.queues[name]
            try:
                await server.queues.create(queue.stored, max_priority(queue))
            except BaseException:
                vhost.remove_queue(name)
                raise
    await topology.save()
