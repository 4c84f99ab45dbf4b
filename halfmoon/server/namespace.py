"""Namespaces: a tenant's topics and groups, stored as ``namespace%name`` as RocketMQ does.

A client configured with a namespace (the official clients' ``namespace``
option) names its topics and groups without it; it sends the namespace in
each ``Resource.resource_namespace`` and in the ``x-mq-namespace`` header
(the Node.js client sets only the header on its consumer requests). The
server keeps every topic and group under its *stored name*, the one
RocketMQ's ``NamespaceUtil.wrapNamespace`` builds:

    orders            in namespace ns   ->  ns%orders
    %DLQ%billing      in namespace ns   ->  %DLQ%ns%billing   (also %RETRY%)
    ns%orders         in namespace ns   ->  ns%orders         (already namespaced)

and answers with the name the client used plus ``resource_namespace``
(``NamespaceUtil.withoutNamespace`` / ``getNamespaceFromResource``), so two
tenants using the same names never meet. A namespace is 1 to 125 letters,
digits, ``_`` or ``-`` (RocketMQ's topic characters without ``%``, which
would make the stored name ambiguous, and ``|``); the stored name must still
fit the limit (127 characters for a topic; 120 for a group, as for every
group, so that its ``%DLQ%`` topic fits too: :mod:`halfmoon.broker.groups`).
Names only the broker uses
(``RMQ_SYS_*``, ``%HM_TIMER%``, ``CID_RMQ_SYS_*``) are never namespaced, as
in RocketMQ; users cannot create them, so no tenant data lives there.

A namespace is not an access boundary: a client without one may name
``ns%orders`` directly (so may an operator, through the admin API).
"""

from __future__ import annotations

import functools
import re

from rocketmq.grpc_protocol import definition_pb2

from halfmoon.broker.errors import IllegalGroup, IllegalTopic
from halfmoon.broker.groups import MAX_GROUP_LENGTH
from halfmoon.broker.topics import DLQ_PREFIX, MAX_TOPIC_LENGTH, RETRY_PREFIX, is_reserved
from halfmoon.errors import InvalidArgument

SEPARATOR = "%"
HEADER = "x-mq-namespace"
# Room for a one-character name after "namespace%" within the topic limit.
MAX_NAMESPACE_LENGTH = MAX_TOPIC_LENGTH - 2
_NAMESPACE = re.compile(r"^[A-Za-z0-9_-]+$")
# A namespace with these prefixes would make its stored names look like the broker's own.
_RESERVED_NAMESPACE_PREFIXES = ("rmq_sys_", "cid_rmq_sys_")


class IllegalNamespace(InvalidArgument):
    code = "ILLEGAL_NAMESPACE"
    protocol_code = "BAD_REQUEST"  # the protocol has no namespace code


def _retry_or_dlq_prefix(name: str) -> str:
    if name.startswith(RETRY_PREFIX):
        return RETRY_PREFIX
    if name.startswith(DLQ_PREFIX):
        return DLQ_PREFIX
    return ""


def is_system(name: str) -> bool:
    """A broker-only name: never namespaced (RocketMQ's ``isSystemResource``)."""
    if _retry_or_dlq_prefix(name):
        return False
    return is_reserved(name) or name.startswith(("rmq_sys_", "CID_RMQ_SYS_"))


@functools.lru_cache(maxsize=1024)
def check_namespace(namespace: str) -> str:
    """``namespace`` when it is a legal namespace, else IllegalNamespace saying why."""
    if not namespace or len(namespace) > MAX_NAMESPACE_LENGTH or not _NAMESPACE.match(namespace):
        raise IllegalNamespace(
            f"illegal namespace {namespace!r}: use 1 to {MAX_NAMESPACE_LENGTH} letters, "
            "digits, '_' or '-'"
        )
    if namespace.lower().startswith(_RESERVED_NAMESPACE_PREFIXES):
        raise IllegalNamespace(
            f"namespace {namespace!r} is reserved (names starting with 'rmq_sys_' or "
            "'CID_RMQ_SYS_' are the broker's own); pick another"
        )
    return namespace


def wrap(namespace: str, name: str) -> str:
    """The stored name of ``name`` in ``namespace`` (``NamespaceUtil.wrapNamespace``)."""
    if not namespace or not name or is_system(name):
        return name
    prefix = _retry_or_dlq_prefix(name)
    bare = name[len(prefix) :]
    if bare.startswith(namespace + SEPARATOR):
        return name  # already in this namespace
    return f"{prefix}{namespace}{SEPARATOR}{bare}"


@functools.lru_cache(maxsize=4096)  # on the delivery path, for every message
def split(stored: str) -> tuple[str, str]:
    """``(namespace, name)`` of a stored name; namespace "" when it has none."""
    if not stored or is_system(stored):
        return "", stored
    prefix = _retry_or_dlq_prefix(stored)
    bare = stored[len(prefix) :]
    index = bare.find(SEPARATOR)
    if index <= 0:
        return "", stored
    return bare[:index], prefix + bare[index + 1 :]


def in_namespace(stored: str, namespace: str) -> bool:
    """Whether ``stored`` belongs to ``namespace`` (its DLQ and retry topics included)."""
    return split(stored)[0] == namespace


@functools.lru_cache(maxsize=4096)  # on the send path, for every message of a namespace
def stored_name(namespace: str, name: str, kind: str = "topic") -> str:
    """``wrap`` with the namespace checked and the stored name's length too.

    ``kind`` is ``"topic"`` or ``"group"`` (their length limits differ).
    """
    if not namespace:
        return name
    check_namespace(namespace)
    stored = wrap(namespace, name)
    if stored is name or _retry_or_dlq_prefix(stored):
        return stored  # unchanged, or a DLQ/retry topic: the broker checks those itself
    limit, error = (
        (MAX_GROUP_LENGTH, IllegalGroup) if kind == "group" else (MAX_TOPIC_LENGTH, IllegalTopic)
    )
    if len(stored) > limit:
        what = "consumer group" if kind == "group" else "topic"
        raise error(
            f"{what} {name!r} in namespace {namespace!r} is stored as {stored!r}, "
            f"{len(stored)} characters; a namespaced {what} name may have at most {limit}"
        )
    return stored


def request_namespace(resource: definition_pb2.Resource, header: str) -> str:
    """The namespace a request's Resource is in: its own, else the ``x-mq-namespace`` header.

    Both set and different is refused: the official clients always send the same one.
    """
    own = resource.resource_namespace
    if own and header and own != header:
        raise IllegalNamespace(
            f"resource {resource.name!r} names namespace {own!r} but the request's "
            f"x-mq-namespace header says {header!r}; configure one namespace per client"
        )
    return own or header


def resolve(resource: definition_pb2.Resource, header: str = "", kind: str = "topic") -> str:
    """The stored name a request's Resource stands for."""
    namespace = request_namespace(resource, header)
    if not namespace:
        return resource.name
    return stored_name(namespace, resource.name, kind)


def resource(stored: str) -> definition_pb2.Resource:
    """The Resource a response carries for a stored name: the bare name plus its namespace."""
    namespace, name = split(stored)
    return definition_pb2.Resource(name=name, resource_namespace=namespace)
