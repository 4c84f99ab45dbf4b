"""Methods that hand their call to a part the object holds.

An object made of parts (the in-process broker over :mod:`~halfmoon.broker.pop_router`,
:mod:`~halfmoon.broker.pull`, ...; the message store over its reader and writer)
declares a method that only passes its arguments on as
``name = delegate("_part", Part.name)``: the part's method is the one place its
signature and body are written, and ``inspect.signature`` of the delegating
method is the part's (``functools.wraps``), which
``tests/broker/test_facade_contract.py`` compares with the facade's declaration.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def delegate(
    part: str, method: Callable[Concatenate[Any, P], R]
) -> Callable[Concatenate[Any, P], R]:
    """A method that calls ``method`` (by name) on the instance's attribute ``part``."""
    name = method.__name__

    def delegated(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = getattr(getattr(self, part), name)(*args, **kwargs)
        return result

    functools.update_wrapper(delegated, method)
    return delegated
