"""What a consumer subscribes with, and the compiled filters the broker caches.

A :class:`FilterSpec` is the plain value that crosses the server/broker
boundary. :class:`FilterCache` compiles each distinct spec once (an invalid
expression raises ``FilterExpressionError``, code ``ILLEGAL_FILTER_EXPRESSION``)
and turns it into the two things a store read takes: the accepted tag hashes
(checked on consume-queue entries, before the commit log is read) and a
predicate over the decoded message (the real tag, since hashes can collide,
and SQL92 over properties).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from halfmoon.broker.filter import compile_filter
from halfmoon.broker.message import SYSTEM_PROPERTIES
from halfmoon.store.api import MessagePredicate, TagHashes
from halfmoon.store.message import StoredMessage

FILTER_KINDS = ("TAG", "SQL92")


@dataclass(frozen=True)
class FilterSpec:
    kind: str = "TAG"
    expression: str = "*"

    @property
    def matches_all(self) -> bool:
        return self.kind == "TAG" and self.expression.strip() in ("", "*")


MATCH_ALL = FilterSpec()


def compile_spec(spec: FilterSpec) -> Any:
    """The compiled filter: ``.matches_message(tag, properties)`` and ``.tag_hash_codes``."""
    return compile_filter(spec.kind, spec.expression)


def filter_properties(stored: StoredMessage) -> dict[str, str]:
    """The properties a SQL92 filter sees: user properties, plus TAGS as RocketMQ allows."""
    props = {k: v for k, v in stored.properties.items() if k not in SYSTEM_PROPERTIES}
    tag = stored.tags
    if tag is not None:
        props["TAGS"] = tag
    return props


@dataclass(frozen=True)
class CompiledFilter:
    spec: FilterSpec
    tag_hashes: TagHashes
    predicate: MessagePredicate | None
    compiled: Any

    def matches(self, stored: StoredMessage) -> bool:
        return self.predicate is None or self.predicate(stored)


class FilterCache:
    """Compiled filters by spec, least recently used evicted past ``capacity``."""

    def __init__(self, capacity: int = 1024) -> None:
        self._capacity = capacity
        self._cache: OrderedDict[FilterSpec, CompiledFilter] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, spec: FilterSpec) -> CompiledFilter:
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                return hit
        compiled = self._compile(spec)
        with self._lock:
            self._cache[spec] = compiled
            if len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
        return compiled

    @staticmethod
    def _compile(spec: FilterSpec) -> CompiledFilter:
        kind = spec.kind.upper()
        normalized = FilterSpec(kind, spec.expression)
        if normalized.matches_all:
            return CompiledFilter(spec, None, None, None)
        compiled = compile_spec(normalized)
        hashes = compiled.tag_hash_codes

        def predicate(stored: StoredMessage) -> bool:
            return bool(compiled.matches_message(stored.tags, filter_properties(stored)))

        return CompiledFilter(spec, hashes, predicate, compiled)
