"""Every class of halfmoon/ owns what its methods use: no mixin whose methods need attributes
a subclass defines, no hook that raises ``NotImplementedError``.

A class that outgrows a module becomes objects that hold their parts and delegate; a base
class whose methods read ``self.x`` that only a subclass sets is one class split over files.
An interface is a ``Protocol`` or an ``abc.ABC`` with ``abstractmethod``, so a missing
method is found when the object is built (or by the type checker), not when it is called.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import halfmoon

ROOT = Path(next(iter(halfmoon.__path__)))
# Bases that supply no attribute a method could rely on.
EMPTY_BASES = {"object", "Generic", "ABC"}


@functools.cache
def _classes() -> list[tuple[str, ast.ClassDef]]:
    return [
        (str(path.relative_to(ROOT.parent)), node)
        for path in sorted(ROOT.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    ]


def _base_names(node: ast.ClassDef) -> list[str]:
    names = []
    for base in node.bases:
        while isinstance(base, ast.Subscript):
            base = base.value
        names.append(base.attr if isinstance(base, ast.Attribute) else ast.unparse(base))
    return names


def _is_protocol(node: ast.ClassDef) -> bool:
    return "Protocol" in _base_names(node)


def _self_attributes(node: ast.ClassDef, *, stored: bool) -> set[str]:
    """The ``self.x`` (or ``cls.x``) a class's methods store (``stored``) or read."""
    found = set()
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Name)
            and sub.value.id in ("self", "cls")
            and isinstance(sub.ctx, ast.Store) == stored
        ):
            found.add(sub.attr)
    return found


def _bare_annotations(node: ast.ClassDef) -> set[str]:
    return {
        statement.target.id
        for statement in node.body
        if isinstance(statement, ast.AnnAssign)
        and statement.value is None
        and isinstance(statement.target, ast.Name)
    }


def _class_level(node: ast.ClassDef) -> set[str]:
    """Names the class body itself binds: methods, nested classes, assignments, fields."""
    names = set()
    for statement in node.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(statement.name)
        elif isinstance(statement, ast.Assign):
            names |= {
                n.id for t in statement.targets for n in ast.walk(t) if isinstance(n, ast.Name)
            }
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            names.add(statement.target.id)
    # object.__setattr__(self, "name", value): a frozen dataclass's __post_init__
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == "__setattr__"
            and len(sub.args) >= 2
            and isinstance(sub.args[1], ast.Constant)
        ):
            names.add(str(sub.args[1].value))
    return names


def _owned(node: ast.ClassDef) -> set[str]:
    return _class_level(node) | _self_attributes(node, stored=True)


def test_the_checks_see_the_classes() -> None:
    names = {node.name for _, node in _classes()}
    assert {"Broker", "MessageStore", "HalfmoonError"} <= names


def test_no_class_reads_an_attribute_it_neither_owns_nor_inherits() -> None:
    by_name: dict[str, list[ast.ClassDef]] = {}
    for _, node in _classes():
        by_name.setdefault(node.name, []).append(node)

    def inherited(name: str, seen: set[str]) -> set[str] | None:
        """What ``name`` and its bases own; None when a base is not halfmoon's."""
        if name in EMPTY_BASES:
            return set()
        if name not in by_name or name in seen:
            return None if name not in by_name else set()
        seen.add(name)
        owned: set[str] = set()
        for node in by_name[name]:
            owned |= _owned(node)
            for base in _base_names(node):
                from_base = inherited(base, seen)
                if from_base is None:
                    return None
                owned |= from_base
        return owned

    borrowed = {}
    for module, node in _classes():
        if _is_protocol(node):
            continue
        owned = inherited(node.name, set())
        if owned is None:  # a base from outside (Exception, Thread, ...) may supply them
            continue
        declared_only = _bare_annotations(node) - _self_attributes(node, stored=True)
        missing = (_self_attributes(node, stored=False) - owned) | (
            _self_attributes(node, stored=False) & declared_only - _class_level_values(node)
        )
        if missing:
            borrowed[f"{module}:{node.lineno} {node.name}"] = sorted(missing)
    assert borrowed == {}, "give these classes their attributes (an __init__ that takes them)"


def _class_level_values(node: ast.ClassDef) -> set[str]:
    """Annotated names that are fields of a dataclass (set by its generated __init__)."""
    decorators = ast.unparse(node.decorator_list) if node.decorator_list else ""
    bases = _base_names(node)
    if "dataclass" in decorators or {"NamedTuple", "TypedDict"} & set(bases):
        return _bare_annotations(node)
    return set()


def test_no_method_is_a_hook_that_raises_not_implemented() -> None:
    hooks = []
    for module, node in _classes():
        for statement in node.body:
            if not isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = [
                s
                for s in statement.body
                if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            ]
            if (
                len(body) == 1
                and isinstance(body[0], ast.Raise)
                and body[0].exc is not None
                and "NotImplementedError" in ast.unparse(body[0].exc)
            ):
                hooks.append(f"{module}:{statement.lineno} {node.name}.{statement.name}")
    assert hooks == [], "make these a Protocol or an abc.abstractmethod"
