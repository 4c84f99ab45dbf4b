"""A small saga helper: steps with compensations, forward then (on failure) backward.

    saga = Saga("place-order", engine, Inbox("order-saga"))

    @saga.step("reserve", compensation=release_stock)
    def reserve(conn, ctx): ...

    result = saga.run(order_id, {"qty": 3})

Each step's action runs in its own database transaction together with an
inbox row ``saga:<name>:<id>:<step>:done``; each compensation likewise with
``...:<step>:undone``. So every step and every compensation takes effect at
most once per saga id, however many times :meth:`Saga.run` is called (after
a crash, on a redelivered command). A failing step's own transaction is
rolled back (it needs no compensation); the steps before it are compensated
in reverse order, and the saga is marked aborted, so a later ``run`` with
the same id finishes compensating instead of trying forward again.

Steps that call other services must make those calls idempotent themselves
(pass the saga id as the idempotency key); the inbox covers the local part.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine

from halfmoon.errors import HalfmoonError
from halfmoon.outbox.inbox import Inbox

log = logging.getLogger("halfmoon.outbox.saga")

StepFn = Callable[[Connection, dict[str, Any]], Any]
COMPLETED = "completed"
COMPENSATED = "compensated"


class SagaCompensationFailed(HalfmoonError):
    """A compensation raised; run the saga again with the same id to resume compensating."""

    code = "SAGA_COMPENSATION_FAILED"
    protocol_code = "INTERNAL_ERROR"


@dataclass(frozen=True)
class SagaStep:
    name: str
    action: StepFn
    compensation: StepFn | None = None


@dataclass
class SagaResult:
    """How a run ended: ``completed`` or ``compensated`` (with the failing step and error)."""

    saga_id: str
    status: str
    completed: list[str] = field(default_factory=list)
    compensated: list[str] = field(default_factory=list)
    failed_step: str | None = None
    error: BaseException | None = None


class Saga:
    """Steps run forward; on a failure, the completed ones are compensated in reverse order."""

    def __init__(
        self, name: str, engine: Engine, inbox: Inbox, steps: Sequence[SagaStep] = ()
    ) -> None:
        self.name = name
        self.engine = engine
        self.inbox = inbox
        self.steps: list[SagaStep] = list(steps)
        names = [s.name for s in self.steps]
        if len(set(names)) != len(names):
            raise ValueError(f"saga {name!r} has duplicate step names: {names}")

    def step(self, name: str, *, compensation: StepFn | None = None) -> Callable[[StepFn], StepFn]:
        """Decorator: append ``fn(conn, ctx)`` as the step ``name``."""

        def add(fn: StepFn) -> StepFn:
            if any(s.name == name for s in self.steps):
                raise ValueError(f"saga {self.name!r} already has a step {name!r}")
            self.steps.append(SagaStep(name, fn, compensation))
            return fn

        return add

    def _key(self, saga_id: str, *parts: str) -> str:
        return ":".join(("saga", self.name, saga_id, *parts))

    def run(self, saga_id: str, context: dict[str, Any] | None = None) -> SagaResult:
        """Run (or resume) saga ``saga_id``; ``context`` is passed to every step."""
        ctx = context if context is not None else {}
        result = SagaResult(saga_id, COMPLETED)
        with self.engine.connect() as conn:
            aborted = self.inbox.seen(conn, self._key(saga_id, "aborted"))
        if not aborted:
            for step in self.steps:
                try:
                    with self.inbox.once(
                        self.engine, self._key(saga_id, step.name, "done")
                    ) as delivery:
                        if delivery:
                            step.action(delivery.conn, ctx)
                except Exception as exc:  # noqa: BLE001 - the saga's answer to a failed step is to compensate
                    log.info(
                        "event=saga_step_failed saga=%s id=%s step=%s error=%s",
                        self.name,
                        saga_id,
                        step.name,
                        type(exc).__name__,
                    )
                    result.failed_step, result.error = step.name, exc
                    with self.inbox.once(self.engine, self._key(saga_id, "aborted")):
                        pass
                    aborted = True
                    break
                result.completed.append(step.name)
        if aborted:
            result.status = COMPENSATED
            self._compensate(saga_id, ctx, result)
        return result

    def _compensate(self, saga_id: str, ctx: dict[str, Any], result: SagaResult) -> None:
        with self.engine.connect() as conn:
            done = [
                s for s in self.steps if self.inbox.seen(conn, self._key(saga_id, s.name, "done"))
            ]
        result.completed = [s.name for s in done]
        for step in reversed(done):
            if step.compensation is None:
                continue
            try:
                with self.inbox.once(
                    self.engine, self._key(saga_id, step.name, "undone")
                ) as delivery:
                    if delivery:
                        step.compensation(delivery.conn, ctx)
            except Exception as exc:
                raise SagaCompensationFailed(
                    f"saga {self.name!r} id {saga_id!r}: compensating step {step.name!r} failed "
                    f"({type(exc).__name__}: {exc}); "
                    "fix the cause and run the saga again with the same id to resume compensating"
                ) from exc
            result.compensated.append(step.name)
