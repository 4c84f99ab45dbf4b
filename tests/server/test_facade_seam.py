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
AMQP = Path(__file__).resolve().parents[2] / "halfmoon" / "amqp"
# Every front end's modules: the gRPC servicer and admin API, and the AMQP endpoint.
FRONT_ENDS = sorted([*SERVER.glob("*.py"), *AMQP.rglob("*.py")])
# The operations of ``Broker`` and of the optional capabilities the facade declares beside it
# (``WatchesArrivals``: a front end checks it with isinstance first).
PROTOCOLS = [
    cls
    for cls in vars(facade).values()
    if isinstance(cls, type)
    and getattr(cls, "_is_protocol", False)
    and cls.__module__ == facade.__name__
]
FACADE = {name for cls in PROTOCOLS for name in facade.operations(cls)}
# Where a broker is held: ``broker``, ``self.broker``, ``self._broker``, ``broker_of(request)``.
HOLDERS = {"broker", "_broker"}


def _is_broker(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in HOLDERS
    if isinstance(node, ast.Attribute):
        # ``self.broker``, not ``config.broker`` (the broker's settings section).
        return node.attr in HOLDERS and isinstance(node.value, ast.Name) and node.value.id == "self"
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
    assert {"Broker", "WatchesArrivals"} <= {cls.__name__ for cls in PROTOCOLS}
    used = {
        (path.name, line, attr) for path in FRONT_ENDS for line, attr in _broker_attributes(path)
    }
    assert any(name == "grpc_service.py" for name, _, _ in used)  # the walk finds the calls
    assert any(name == "admin_messages.py" for name, _, _ in used)
    assert any(name == "queues.py" for name, _, _ in used)  # halfmoon/amqp
    below = sorted(
        f"{name}:{line} broker.{attr}" for name, line, attr in used if attr not in FACADE
    )
    assert below == [], "front ends reach below the Broker facade: " + ", ".join(below)


def test_only_the_composition_root_imports_the_store_or_the_in_process_broker() -> None:
    forbidden = ("halfmoon.store", "halfmoon.broker.broker")
    offenders = []
    for path in FRONT_ENDS:
        if path.name == "app.py" and path.parent == SERVER:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            offenders += [f"{path.name}: {n}" for n in names if n.startswith(forbidden)]
    assert offenders == []
