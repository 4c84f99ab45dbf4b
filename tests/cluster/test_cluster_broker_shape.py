"""ClusterBroker's shape (halfmoon/cluster/proxy/cluster_broker.py), read without a cluster: every
facade operation with the facade's signature, and the ones that only pass a call on to a part
declared with ``delegate`` rather than written out again."""

from __future__ import annotations

import ast
import inspect
import textwrap

from halfmoon.broker.facade import Broker, operations
from halfmoon.cluster.internal import network_hop
from halfmoon.cluster.internal.remote_broker import RemoteBroker
from halfmoon.cluster.proxy.cluster_broker import ClusterBroker
from halfmoon.delegation import delegate

_DELEGATED = delegate("part", str.upper).__code__  # what every delegate runs


def test_every_facade_operation_has_the_facade_signature() -> None:
    declared = operations(Broker)
    assert len(declared) >= 50
    for name, declaration in declared.items():
        implemented = inspect.getattr_static(ClusterBroker, name)
        if isinstance(declaration, property):
            assert isinstance(implemented, property), name
            continue
        wanted = inspect.signature(declaration).parameters.values()
        got = inspect.signature(implemented).parameters.values()
        assert [(p.name, p.kind, p.default) for p in got] == [
            (p.name, p.kind, p.default) for p in wanted
        ], name


def _passes_on(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """``return self.<part>.<same name>(...)`` (or the call alone) and nothing else."""
    body = [s for s in function.body if not isinstance(s, ast.Expr | ast.Return) or s.value]
    if len(body) != 1 or not isinstance(body[0], ast.Expr | ast.Return):
        return False
    call = body[0].value
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == function.name
        and isinstance(call.func.value, ast.Attribute)
        and isinstance(call.func.value.value, ast.Name)
        and call.func.value.value.id == "self"
    )


def test_what_only_passes_a_call_on_is_delegated_not_written_out() -> None:
    tree = ast.parse(textwrap.dedent(inspect.getsource(ClusterBroker)))
    (cls,) = tree.body
    assert isinstance(cls, ast.ClassDef)
    written = [
        node.name
        for node in cls.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _passes_on(node)
    ]
    assert written == []
    delegated = [
        name
        for name, value in vars(ClusterBroker).items()
        if inspect.isfunction(value) and value.__code__ is _DELEGATED
    ]
    assert len(delegated) >= 60


def test_the_facades_over_the_network_inherit_nothing() -> None:
    # Their fast-path refusals are plain functions each takes as a method (network_hop.py).
    assert ClusterBroker.__bases__ == (object,)
    assert RemoteBroker.__bases__ == (object,)
    assert ClusterBroker.ack_nowait is network_hop.ack_nowait
    assert RemoteBroker.receive_nowait is network_hop.receive_nowait
