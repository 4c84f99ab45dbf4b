"""ACL 2.0's model: users, and policies of (resource, actions, source IPs, decision).

A **resource** is ``Cluster``, ``Namespace:<ns>``, ``Topic:<name>`` or
``Group:<name>``; a name ending in ``*`` matches by prefix (``Topic:orders-*``,
``Topic:*``). ``Namespace:<ns>`` covers every topic and group stored in that
namespace (``<ns>%name``). **Actions** are Pub, Sub, Create, Update, Delete,
Get, List and All (every action). An entry applies when its resource
matches, it names the action (or All) and the request's source IP is in its
``source_ips`` (none listed: any address).

Evaluation (:func:`decide`): a super user is allowed everything; otherwise
any applicable Deny wins, then any applicable Allow allows, and nothing
applicable denies. Policies are documents a user writes, so
:func:`entry_from_dict` checks every field and says what is wrong.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from halfmoon.auth.errors import IllegalPolicy

ACTIONS = ("Pub", "Sub", "Create", "Update", "Delete", "Get", "List", "All")
RESOURCE_TYPES = ("Cluster", "Namespace", "Topic", "Group")
DECISIONS = ("Allow", "Deny")
USER_TYPES = ("Super", "Normal")
_MAX_NAME = 255


@dataclass(frozen=True)
class Resource:
    kind: str  # one of RESOURCE_TYPES
    name: str = ""  # "" for Cluster

    def __str__(self) -> str:
        return self.kind if self.kind == "Cluster" else f"{self.kind}:{self.name}"


def parse_resource(text: object) -> Resource:
    if not isinstance(text, str) or not text.strip():
        raise IllegalPolicy("a resource must be Cluster, Namespace:NS, Topic:NAME or Group:NAME")
    kind, _, name = text.strip().partition(":")
    canonical = {t.lower(): t for t in RESOURCE_TYPES}.get(kind.lower())
    if canonical is None:
        raise IllegalPolicy(
            f"resource type {kind[:40]!r} is not one of {', '.join(RESOURCE_TYPES)}"
        )
    if canonical == "Cluster":
        return Resource("Cluster", "")
    if not name or len(name) > _MAX_NAME or any(c.isspace() or ord(c) < 32 for c in name):
        raise IllegalPolicy(
            f"resource {text[:80]!r} needs a name (no spaces, at most {_MAX_NAME} characters), "
            f"e.g. {canonical}:orders or {canonical}:orders-*"
        )
    if "*" in name[:-1]:
        raise IllegalPolicy(f"resource {text[:80]!r}: '*' may only end a name (prefix match)")
    return Resource(canonical, name)


def parse_actions(value: object) -> frozenset[str]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise IllegalPolicy(f"actions must be a non-empty list of {', '.join(ACTIONS)}")
    canonical = {a.lower(): a for a in ACTIONS}
    out = set()
    for item in items:
        action = canonical.get(item.strip().lower()) if isinstance(item, str) else None
        if action is None:
            raise IllegalPolicy(f"action {str(item)[:40]!r} is not one of {', '.join(ACTIONS)}")
        out.add(action)
    return frozenset(out)


def parse_networks(value: object) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise IllegalPolicy("source_ips must be a list of addresses or CIDR ranges")
    out = []
    for item in items:
        try:
            out.append(str(ipaddress.ip_network(str(item).strip(), strict=False)))
        except ValueError:
            raise IllegalPolicy(
                f"source IP {str(item)[:60]!r} is not an address or CIDR range"
            ) from None
    return tuple(out)


@dataclass(frozen=True)
class PolicyEntry:
    resource: Resource
    actions: frozenset[str]
    source_ips: tuple[str, ...] = ()
    decision: str = "Allow"

    def to_dict(self) -> dict[str, Any]:
        return {
            "resource": str(self.resource),
            "actions": sorted(self.actions),
            "source_ips": list(self.source_ips),
            "decision": self.decision,
        }

    def applies(self, resource: Resource, action: str, source_ip: str) -> bool:
        if not (action in self.actions or "All" in self.actions):
            return False
        if not resource_matches(self.resource, resource):
            return False
        return not self.source_ips or ip_in(source_ip, self.source_ips)


def entry_from_dict(document: object) -> PolicyEntry:
    if not isinstance(document, Mapping):
        raise IllegalPolicy("a policy entry must be an object with resource and actions")
    unknown = set(document) - {"resource", "actions", "source_ips", "decision"}
    if unknown:
        raise IllegalPolicy(f"unknown policy field {sorted(map(str, unknown))[0][:40]!r}")
    decision = document.get("decision", "Allow")
    canonical = {d.lower(): d for d in DECISIONS}
    if not isinstance(decision, str) or decision.lower() not in canonical:
        raise IllegalPolicy("decision must be Allow or Deny")
    return PolicyEntry(
        parse_resource(document.get("resource")),
        parse_actions(document.get("actions")),
        parse_networks(document.get("source_ips")),
        canonical[decision.lower()],
    )


def _name_matches(pattern: str, name: str) -> bool:
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return pattern == name


def resource_matches(pattern: Resource, resource: Resource) -> bool:
    """Does policy resource ``pattern`` cover the requested ``resource``?"""
    if pattern.kind == resource.kind:
        return resource.kind == "Cluster" or _name_matches(pattern.name, resource.name)
    if pattern.kind == "Namespace" and resource.kind in ("Topic", "Group"):
        namespace, sep, _ = resource.name.partition("%")
        return bool(sep) and _name_matches(pattern.name, namespace)
    return False


def ip_in(address: str, networks: Iterable[str]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False  # an unparseable peer never matches a restricted entry
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in ipaddress.ip_network(n) for n in networks)


@dataclass
class User:
    access_key: str
    secret_key: str = field(repr=False)
    user_type: str = "Normal"  # Super or Normal
    enabled: bool = True

    @property
    def is_super(self) -> bool:
        return self.user_type == "Super"

    def public(self) -> dict[str, Any]:
        """What the API and CLI show: never the secret."""
        return {"access_key": self.access_key, "user_type": self.user_type, "enabled": self.enabled}


def check_access_key(access_key: object) -> str:
    if (
        not isinstance(access_key, str)
        or not access_key
        or len(access_key) > 128
        or not all(c.isalnum() or c in "-_.@" for c in access_key)
    ):
        raise IllegalPolicy(
            "an access key is 1-128 letters, digits or - _ . @ (e.g. orders-service)"
        )
    return access_key


def check_secret_key(secret_key: object) -> str:
    if not isinstance(secret_key, str) or not 8 <= len(secret_key) <= 256:
        raise IllegalPolicy("a secret key is a string of 8 to 256 characters")
    if any(ord(c) < 32 for c in secret_key):
        raise IllegalPolicy("a secret key may not hold control characters")
    return secret_key


def check_user_type(user_type: object) -> str:
    canonical = {t.lower(): t for t in USER_TYPES}
    if not isinstance(user_type, str) or user_type.lower() not in canonical:
        raise IllegalPolicy("user_type must be Super or Normal")
    return canonical[user_type.lower()]


def decide(
    user: User, entries: Iterable[PolicyEntry], resource: Resource, action: str, source_ip: str
) -> bool:
    """True when ``user`` may do ``action`` on ``resource`` from ``source_ip``."""
    if user.is_super:
        return True
    allowed = False
    for entry in entries:
        if entry.applies(resource, action, source_ip):
            if entry.decision == "Deny":
                return False
            allowed = True
    return allowed
