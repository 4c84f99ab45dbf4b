"""Facade operations forwarded as they are declared: one ``Call`` over the internal protocol.

Most of what a proxy asks of a broker process needs nothing but its arguments
carried across, so :class:`halfmoon.cluster.internal.remote_broker.RemoteBroker` does not
write those methods out: ``tick = forward(Administration.tick)`` makes one
from the declaration in :mod:`halfmoon.broker.facade`, with its signature (its
defaults are filled in on this side, as a written-out forward would) and its
docstring. A type checker sees the declaration itself (``forward`` returns its
argument's type), so the class is still checked against the protocol.

On the wire, positional parameters go as the call's ``args`` and keyword-only
ones (and a ``**`` parameter's) as its ``kwargs``, which is how the broker side
(:mod:`halfmoon.cluster.internal.internal_service`) binds them again. A parameter
declared ``Sequence[...]`` goes as a list and ``Mapping[...]`` as a dict: a
caller's tuple or mapping view would otherwise arrive as something else (or
not encode at all).

A ``*_nowait`` operation is forwarded with :func:`forward_pending`: its answer
is a :class:`~halfmoon.broker.facade_types.Pending` whose write is the call
(it crosses the network, so it is never made on the caller's event loop), and
the broker process answers that call once its promise holds (the internal
service waits for the durable future before answering).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol, TypeVar, cast

from halfmoon.broker.facade_types import Pending

__all__ = ["forward", "forward_pending"]

Declared = TypeVar("Declared", bound=Callable[..., Any])

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class Calls(Protocol):
    """What a forward runs on: one facade operation, by name, in the broker process."""

    def _call(
        self, operation: str, args: list[Any], kwargs: dict[str, Any] | None = None
    ) -> Any: ...


def _wire_form(annotation: object) -> Callable[[Any], Any] | None:
    """How an argument declared ``annotation`` is carried (None: as it is)."""
    text = str(annotation)  # the facade's annotations are strings (postponed evaluation)
    if text.startswith("Sequence["):
        return list
    if text.startswith("Mapping["):
        return dict
    return None


def forward(declared: Declared) -> Declared:
    """A method that runs the facade operation ``declared`` in the broker process, with
    ``declared``'s name, signature and docstring."""
    name = declared.__name__
    signature = inspect.signature(declared)
    parameters = list(signature.parameters.values())[1:]  # after self
    forms = {p.name: _wire_form(p.annotation) for p in parameters}

    def carried(parameter: str, value: Any) -> Any:
        form = forms[parameter]
        return value if form is None or value is None else form(value)

    # Most operations take plain positional parameters: a call by position needs no binding,
    # only the defaults of what it leaves out (binding costs more than the rest of the call).
    plain = all(p.kind in _POSITIONAL and forms[p.name] is None for p in parameters)
    defaults = [p.default for p in parameters]
    required = sum(1 for p in parameters if p.default is inspect.Parameter.empty)

    def call(self: Calls, *args: Any, **kwargs: Any) -> Any:
        if plain and not kwargs and required <= len(args) <= len(defaults):
            return self._call(name, [*args, *defaults[len(args) :]], {})
        bound = signature.bind(self, *args, **kwargs)  # a wrong call fails here, not remotely
        bound.apply_defaults()
        positional: list[Any] = []
        keywords: dict[str, Any] = {}
        for p in parameters:
            value = bound.arguments[p.name]
            if p.kind in _POSITIONAL:
                positional.append(carried(p.name, value))
            elif p.kind is inspect.Parameter.VAR_POSITIONAL:
                positional.extend(value)
            elif p.kind is inspect.Parameter.KEYWORD_ONLY:
                keywords[p.name] = carried(p.name, value)
            else:  # VAR_KEYWORD
                keywords.update(value)
        return self._call(name, positional, keywords)

    call.__name__ = name
    call.__qualname__ = f"forward({declared.__qualname__})"
    call.__doc__ = declared.__doc__
    call.__signature__ = signature  # type: ignore[attr-defined]
    call.__annotations__ = dict(declared.__annotations__)
    return cast(Declared, call)


def forward_pending(declared: Declared) -> Declared:
    """:func:`forward` of the ``*_nowait`` operation ``declared``: a ``Pending`` that makes the
    call when its answer is asked for, the answer durable when it arrives."""
    call: Callable[..., Any] = forward(declared)

    def pending(self: Calls, *args: Any, **kwargs: Any) -> Pending[Any]:
        return Pending.of_durable(partial(call, self, *args, **kwargs))

    for attribute in ("__name__", "__qualname__", "__doc__", "__signature__", "__annotations__"):
        setattr(pending, attribute, getattr(call, attribute))
    return cast(Declared, pending)
