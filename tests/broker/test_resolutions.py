"""A decision's resolution and source as they cross the facade (broker/transactions/
resolutions.py): enums made by the front ends, still taken by value from anyone else."""

from __future__ import annotations

import pytest

from halfmoon.broker.transaction_state import TxnEvent
from halfmoon.broker.transactions import DecisionSource, Resolution
from halfmoon.errors import InvalidArgument


def test_a_resolution_is_its_event_and_is_taken_by_value_in_any_case() -> None:
    assert [r.event for r in Resolution] == [TxnEvent.COMMIT, TxnEvent.ROLLBACK, TxnEvent.UNKNOWN]
    assert Resolution.of("COMMIT") is Resolution.COMMIT
    assert Resolution.of(Resolution.UNKNOWN) is Resolution.UNKNOWN
    assert Resolution.COMMIT == "commit"  # what a JSON body or a log line shows
    for bad in ("maybe", "", None, 1):
        with pytest.raises(InvalidArgument, match="use commit, rollback or unknown"):
            Resolution.of(bad)  # type: ignore[arg-type]


def test_a_source_names_who_decided_and_refuses_anyone_else() -> None:
    assert DecisionSource.of("check") is DecisionSource.CHECK
    assert [s.decider for s in DecisionSource] == ["producer", "check", "operator"]
    with pytest.raises(InvalidArgument, match="use client, check or operator"):
        DecisionSource.of("CLIENT")  # sources were never taken in another case
    with pytest.raises(InvalidArgument):
        DecisionSource.of(None)  # type: ignore[arg-type]
