"""The front ends reach the broker only through its facade (halfmoon/broker/facade.py).

Read from the source, so a new call below the facade fails here before it
ships: every attribute the servicer and the admin API take from a broker is
an operation of the ``Broker`` protocol, and no front-end module but the
composition root (``app.py``) imports the store or the in-process broker.
"""

from __future__ import annotations

import ast
from pathlib import Path

from halfmoon.broker import facade

SERVER = Path(__file__).resolve().parents[2] / "halfmoon" / "server"
# The operations of ``Broker`` and of the optional capabilities the facade declares beside it
# (``SendsAsync``, ``WatchesArrivals``: a front end checks them with isinstance first).
PROTOCOLS = [
    cls
    for cls in vars(facade).values()
    if isinstance(cls, type)
    and getattr(cls, "_is_protocol", False)
    and cls.__module__ == facade.__name__
]
FACADE = {name for cls in PROTOCOLS for name in vars(cls) if not name.startswith("_")}
# Where a broker is held: ``broker``, ``self.broker``, ``self._broker``, ``broker_of(request)``.
HOLDERS = {"broker", "_broker"}


def _is_broker(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in HOLDERS
    if isinstance(node, ast.Attribute):
        return node.attr in HOLDERS and isinstance(node.value, ast.Name)
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id == "broker_of"
    return False


def _broker_attributes(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        (node.lineno, node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and _is_broker(node.value)
    ]


def test_front_ends_call_only_facade_operations() -> None:
    assert {"Broker", "SendsAsync", "WatchesArrivals"} <= {cls.__name__ for cls in PROTOCOLS}
    used = {
        (path.name, line, attr)
        for path in sorted(SERVER.glob("*.py"))
        for line, attr in _broker_attributes(path)
    }
    assert any(name == "grpc_service.py" for name, _, _ in used)  # the walk finds the calls
    assert any(name == "admin_messages.py" for name, _, _ in used)
    below = sorted(
        f"{name}:{line} broker.{attr}" for name, line, attr in used if attr not in FACADE
    )
    assert below == [], "front ends reach below the Broker facade: " + ", ".join(below)


def test_only_the_composition_root_imports_the_store_or_the_in_process_broker() -> None:
    forbidden = ("halfmoon.store", "halfmoon.broker.broker")
    offenders = []
    for path in sorted(SERVER.glob("*.py")):
        if path.name == "app.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            offenders += [f"{path.name}: {n}" for n in names if n.startswith(forbidden)]
    assert offenders == []
