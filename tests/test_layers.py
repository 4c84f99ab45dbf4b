"""The import graph between halfmoon's packages: layers, no cycles, nothing importing upward.

A unit is a package under ``halfmoon/`` or a top-level module; cluster mode's parts are units
of their own (``cluster.coordination``, ``cluster.internal``, ``cluster.proxy``, and ``cluster``
for what they share). Every import of one unit by
another, wherever it stands in the file (a deferred import inside a function or under
``TYPE_CHECKING`` is a dependency too), must name a unit on a lower layer. The README's
Development section draws the same table; a new package gets its layer here and there.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import halfmoon

ROOT = Path(next(iter(halfmoon.__path__)))

# Each unit's layer: a unit imports only units of lower layers.
LAYERS: dict[str, int] = {
    # 0: shared ground, importing nothing of halfmoon
    "errors": 0,
    "logs": 0,
    "metrics": 0,
    "failpoints": 0,
    "delegation": 0,
    "environment": 0,
    "shutdown_signals": 0,
    "process_start": 0,
    "gc_tuning": 0,
    "bulkread": 0,
    "verify": 0,
    "extras": 1,
    "listen": 1,  # the listeners' sockets (plaintext and TLS on one port counts in metrics)
    "lifecycle": 1,  # every process's stop signals, drain and cancel
    # storage and credentials
    "store": 1,
    "auth": 1,
    # the in-process broker behind its facade; the client speaks only the wire protocol
    "broker": 2,
    "client": 2,
    # the whole-program configuration, the AMQP front end, the client's users
    "config": 3,
    "amqp": 3,
    "outbox": 3,
    "spark": 3,
    # the network front ends and the process that serves them
    "server": 4,
    # cluster mode above a single server: its errors, etcd coordination, the internal broker
    # protocol (whose broker side decides transaction groups through etcd), then the proxy
    "cluster": 5,
    "cluster.coordination": 6,
    "cluster.internal": 7,
    "cluster.proxy": 8,
    # replication above the internal protocol, beside the proxy; the broker process above both
    "replication": 8,
    "broker_node": 9,
    "cli": 10,
    "__main__": 11,
}

# Imports that break the rule today, each with why; the list only shrinks.
KNOWN_UPWARD = {
    # bootstrap_user raises ConfigError for a bootstrap_recover without its key and secret,
    # importing it inside the function because halfmoon.config imports auth's config.
    ("auth", "config"),
}


# The packages under halfmoon/cluster/ that are units of their own.
CLUSTER_PARTS = {path.parent.name for path in (ROOT / "cluster").glob("*/__init__.py")}


def _unit(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "cluster" and parts[2] in CLUSTER_PARTS:
        return f"cluster.{parts[2]}"
    return parts[1] if len(parts) > 1 else "halfmoon"


def _imports() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) unit pairs, each with the files that make it."""
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT.parent)
        source = _unit(".".join(relative.with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = (
                    [f"halfmoon.{alias.name}" for alias in node.names]
                    if node.module == "halfmoon"
                    else [node.module]
                )
            else:
                continue
            for name in names:
                if name.startswith("halfmoon.") and _unit(name) != source:
                    found[(source, _unit(name))].append(str(relative))
    return found


IMPORTS = _imports()


def test_the_walk_sees_the_imports_of_every_layer() -> None:
    assert ("broker", "store") in IMPORTS
    assert ("server", "broker") in IMPORTS
    assert ("cluster.proxy", "server") in IMPORTS
    assert ("cluster.internal", "cluster.coordination") in IMPORTS
    assert ("cluster.coordination", "cluster") in IMPORTS
    assert ("cli", "cluster.proxy") in IMPORTS


def test_every_unit_has_a_layer() -> None:
    units = {path.stem for path in ROOT.glob("*.py") if path.stem != "__init__"}
    units |= {path.parent.name for path in ROOT.glob("*/__init__.py")}
    units |= {f"cluster.{part}" for part in CLUSTER_PARTS}
    assert units - LAYERS.keys() == set(), "give the new package a layer in LAYERS"


def test_nothing_imports_upward() -> None:
    upward = [
        f"{source} -> {target} ({', '.join(sorted(set(files)))})"
        for (source, target), files in IMPORTS.items()
        if source in LAYERS
        and target in LAYERS
        and LAYERS[target] >= LAYERS[source]
        and (source, target) not in KNOWN_UPWARD
    ]
    assert upward == [], "imports that run up or across the layers: " + "; ".join(upward)


def test_the_known_exceptions_still_exist() -> None:
    # An exception that was mended comes off the list, so it cannot come back unseen.
    assert IMPORTS.keys() >= KNOWN_UPWARD


def test_no_cycle_between_packages() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in IMPORTS.keys() - KNOWN_UPWARD:
        graph[source].add(target)
    done: set[str] = set()

    def visit(unit: str, path: list[str]) -> None:
        if unit in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(unit) :], unit]))
        if unit in done:
            return
        for target in sorted(graph[unit]):
            visit(target, [*path, unit])
        done.add(unit)

    for unit in sorted(graph):
        visit(unit, [])


def test_the_layers_catch_a_store_importing_the_broker() -> None:
    assert LAYERS["store"] < LAYERS["broker"] < LAYERS["server"] < LAYERS["cluster"]


def test_the_layers_catch_coordination_importing_the_proxy() -> None:
    assert LAYERS["cluster.coordination"] < LAYERS["cluster.internal"] < LAYERS["cluster.proxy"]
