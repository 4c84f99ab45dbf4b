"""The checker: is a :class:`~halfmoon.verify.history.History` one a correct broker could produce?

What it checks, precisely (a *unit* is one transaction, ``Send.txn``, or one
transaction group, ``Send.txn_group``; a send in neither is a plain or FIFO
message):

1. **No acknowledged message lost.** A plain or FIFO send whose outcome is
   ``ok`` is delivered at least once. A unit's member whose send is ``ok``
   is delivered when a commit of its unit was acknowledged. When the history
   has a final read (:attr:`History.final_read`), each of those messages is
   in it too: one delivered during the run but missing from the final read
   is *vanished* (the store lost it after handing it out), also an error.
2. **Nothing delivered that cannot have been sent.** A delivery naming no
   send (a phantom), naming a send that ``fail``-ed, or naming a member of
   a unit that was never committed (no commit invoked, or every commit
   refused) or whose rollback was acknowledged, is an error. A unit with
   both a commit and a rollback acknowledged is an error too.
3. **Per-message-group order.** For one producer and one message group, if
   send A was acknowledged before send B was invoked and both were
   delivered, A's first delivery precedes B's first delivery (deliveries
   are ordered by :attr:`Delivery.index`). Redeliveries after that are
   duplicates, not reorderings; sends that were not acknowledged constrain
   nothing.
4. **Every transaction and every transaction group all or nothing.** When
   any member of a unit is delivered, every member whose send was
   acknowledged is delivered (members whose send is ``unknown`` may or may
   not be: they may never have been stored). A unit with some but not all
   acknowledged members delivered is *partial*.

Duplicates (a key delivered more than once during the run, the final read
aside) are allowed (delivery is at least once) and counted.
:class:`CheckResult` holds the counts and the errors;
:attr:`CheckResult.valid` is true when there is no error.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from halfmoon.verify.history import Decision, History, Outcome, Send

Unit = tuple[str, str]  # ("txn", id) or ("group", id)


@dataclass
class CheckResult:
    counts: dict[str, int] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)  # delivered, then gone from the store
    unexpected: list[str] = field(default_factory=list)  # delivered, cannot have been sent
    order_violations: list[str] = field(default_factory=list)
    partial_txns: list[str] = field(default_factory=list)
    partial_groups: list[str] = field(default_factory=list)
    contradictions: list[str] = field(default_factory=list)  # committed and rolled back

    @property
    def errors(self) -> list[str]:
        return [
            *(f"lost: {e}" for e in self.lost),
            *(f"vanished: {e}" for e in self.vanished),
            *(f"unexpected delivery: {e}" for e in self.unexpected),
            *(f"order: {e}" for e in self.order_violations),
            *(f"partial transaction: {e}" for e in self.partial_txns),
            *(f"partial transaction group: {e}" for e in self.partial_groups),
            *(f"decided both ways: {e}" for e in self.contradictions),
        ]

    @property
    def valid(self) -> bool:
        return not self.errors

    def summary(self, show: int = 20) -> str:
        counts = " ".join(f"{name}={value}" for name, value in self.counts.items())
        errors = self.errors
        lines = [f"{'valid' if self.valid else 'INVALID'}: {counts}"]
        lines += [f"  {error}" for error in errors[:show]]
        if len(errors) > show:
            lines.append(f"  ... and {len(errors) - show} more")
        return "\n".join(lines)


def _unit(send: Send | Decision) -> Unit | None:
    if send.txn_group is not None:
        return ("group", send.txn_group)
    if send.txn is not None:
        return ("txn", send.txn)
    return None


def _first_deliveries(history: History) -> tuple[dict[str, int], Counter[str]]:
    first: dict[str, int] = {}
    times: Counter[str] = Counter()
    for delivery in sorted(history.deliveries, key=lambda d: d.index):
        if not delivery.final:  # the final read delivers again what the run saw: no duplicate
            times[delivery.key] += 1
        first.setdefault(delivery.key, delivery.index)
    return first, times


def _order_violations(sends: list[Send], first: dict[str, int]) -> list[str]:
    """Sends of one producer and message group: acknowledged-before-invoked ⇒ delivered before."""
    acked = [s for s in sends if s.outcome is Outcome.OK and s.key in first]
    by_completion = sorted(acked, key=lambda s: s.completed)
    violations = []
    latest: Send | None = None  # of the sends completed so far, the one delivered last
    done = 0
    for send in sorted(acked, key=lambda s: s.invoked):
        while done < len(by_completion) and by_completion[done].completed <= send.invoked:
            earlier = by_completion[done]
            if latest is None or first[earlier.key] > first[latest.key]:
                latest = earlier
            done += 1
        if latest is not None and first[latest.key] > first[send.key]:
            violations.append(
                f"{send.key} (group {send.message_group}) first delivered at "
                f"#{first[send.key]}, before {latest.key} (acknowledged before it was sent) "
                f"at #{first[latest.key]}"
            )
    return violations


def check(history: History) -> CheckResult:
    result = CheckResult()
    first, times = _first_deliveries(history)
    sends = {send.key: send for send in history.sends}
    if len(sends) != len(history.sends):
        repeated = [k for k, n in Counter(s.key for s in history.sends).items() if n > 1]
        raise ValueError(f"send keys must be unique in a history; repeated: {repeated[:5]}")

    members: dict[Unit, list[Send]] = defaultdict(list)
    for send in history.sends:
        unit = _unit(send)
        if unit is not None:
            members[unit].append(send)
    committed: set[Unit] = set()  # a commit acknowledged
    commit_invoked: set[Unit] = set()  # a commit that may have happened (ok or unknown)
    rolled_back: set[Unit] = set()
    for decision in history.decisions:
        unit = _unit(decision)
        if unit is None:
            raise ValueError(f"a decision names no transaction nor group: {decision}")
        if decision.commit and decision.outcome is not Outcome.FAIL:
            commit_invoked.add(unit)
            if decision.outcome is Outcome.OK:
                committed.add(unit)
        elif not decision.commit and decision.outcome is Outcome.OK:
            rolled_back.add(unit)
    result.contradictions = [f"{kind} {name}" for kind, name in sorted(committed & rolled_back)]

    # 1. Lost, and vanished from the store.
    final = {d.key for d in history.deliveries if d.final}
    for send in history.sends:
        unit = _unit(send)
        if send.outcome is not Outcome.OK or (unit is not None and unit not in committed):
            continue
        where = f" ({unit[0]} {unit[1]}, committed)" if unit else ""
        if send.key not in first:
            result.lost.append(f"{send.key}{where}, acknowledged at {send.completed:.3f}")
        elif history.final_read and send.key not in final:
            result.vanished.append(f"{send.key}{where}, first delivered #{first[send.key]}")

    # 2. Unexpected deliveries.
    for key in first:
        found = sends.get(key)
        if found is None:
            result.unexpected.append(f"{key}: no such send")
            continue
        send = found
        if send.outcome is Outcome.FAIL:
            result.unexpected.append(f"{key}: its send failed ({send.error})")
        unit = _unit(send)
        if unit is not None and unit in rolled_back:
            result.unexpected.append(f"{key}: {unit[0]} {unit[1]} was rolled back")
        elif unit is not None and unit not in commit_invoked:
            result.unexpected.append(f"{key}: {unit[0]} {unit[1]} was never committed")

    # 3. Order per producer and message group.
    streams: dict[tuple[str, str], list[Send]] = defaultdict(list)
    for send in history.sends:
        if send.message_group is not None:
            streams[(send.producer, send.message_group)].append(send)
    for stream in streams.values():
        result.order_violations += _order_violations(stream, first)

    # 4. All or nothing.
    for unit, sent in members.items():
        acked = [s for s in sent if s.outcome is Outcome.OK]
        seen = [s for s in sent if s.key in first]
        missing = [s.key for s in acked if s.key not in first]
        if seen and missing:
            text = (
                f"{unit[1]}: {len(seen)} of {len(sent)} delivered, acknowledged missing {missing}"
            )
            (result.partial_groups if unit[0] == "group" else result.partial_txns).append(text)

    outcomes = Counter(send.outcome for send in history.sends)
    units = Counter(kind for kind, _ in members)
    result.counts = {
        "sent": len(history.sends),
        "acked": outcomes[Outcome.OK],
        "failed": outcomes[Outcome.FAIL],
        "unknown": outcomes[Outcome.UNKNOWN],
        "deliveries": len(history.deliveries),
        "delivered": len(first),
        "duplicates": sum(n - 1 for n in times.values()),
        "txns": units["txn"],
        "txn_groups": units["group"],
        "committed": len(committed),
        "rolled_back": len(rolled_back),
        "final_read": len(final),
        "lost": len(result.lost),
        "vanished": len(result.vanished),
        "unexpected": len(result.unexpected),
        "order_violations": len(result.order_violations),
        "txn_partial": len(result.partial_txns),
        "txn_group_partial": len(result.partial_groups),
    }
    return result
