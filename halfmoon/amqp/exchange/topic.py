"""Topic exchange: dot-separated words; ``*`` matches one word, ``#`` zero or more."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any


def matches(
    binding_key: str, arguments: Mapping[str, Any], routing_key: str, headers: Mapping[str, Any]
) -> bool:
    return _match(tuple(binding_key.split(".")), tuple(routing_key.split(".")))


@functools.lru_cache(maxsize=4096)
def _match(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    # reachable[j]: the pattern so far can consume exactly words[:j]
    reachable = [True] + [False] * len(words)
    for part in pattern:
        if part == "#":
            seen = False
            for j in range(len(reachable)):
                seen = seen or reachable[j]
                reachable[j] = seen
        else:
            nxt = [False] * len(reachable)
            for j in range(len(words)):
                if reachable[j] and (part == "*" or part == words[j]):
                    nxt[j + 1] = True
            reachable = nxt
    return reachable[-1]
