"""The checker against hand-made histories: a valid one passes, and each check can fail."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from halfmoon.verify import Decision, History, Outcome, Send, check

OK, FAIL, UNKNOWN = Outcome.OK, Outcome.FAIL, Outcome.UNKNOWN
_clock = itertools.count(1)


def send(key: str, outcome: Outcome = OK, **fields: object) -> Send:
    invoked = float(next(_clock))
    return Send(key, outcome, invoked, invoked + 0.5, producer="p", **fields)  # type: ignore[arg-type]


def decide(commit: bool, outcome: Outcome = OK, **fields: object) -> Decision:
    at = float(next(_clock))
    return Decision(commit, outcome, at, at + 0.5, **fields)  # type: ignore[arg-type]


def history(sends: list[Send], delivered: list[str], decisions: list[Decision] = ()) -> History:  # type: ignore[assignment]
    made = History()
    for sent in sends:
        made.send(sent)
    for decision in decisions:
        made.decide(decision)
    for key in delivered:
        made.deliver(key, 0.0, "c")
    return made


def fifo(key: str, outcome: Outcome = OK) -> Send:
    return send(key, outcome, message_group="g")


def test_a_valid_history_passes_and_counts_everything() -> None:
    sends = [
        send("n1"), send("n2", UNKNOWN), send("n3", FAIL, error="HA_NOT_AVAILABLE"),
        fifo("f1"), fifo("f2", UNKNOWN), fifo("f3"),
        send("t1", txn="t1"), send("t2", txn="t2"), send("t3", UNKNOWN, txn="t3"),
        send("g1a", txn_group="G1"), send("g1b", UNKNOWN, txn_group="G1"),
        send("g2a", txn_group="G2"), send("g2b", txn_group="G2"),
    ]  # fmt: skip
    decisions = [
        decide(True, txn="t1"), decide(False, txn="t2"), decide(True, UNKNOWN, txn="t3"),
        decide(True, txn_group="G1"), decide(True, UNKNOWN, txn_group="G2"),
    ]  # fmt: skip
    # n2 (unknown) was stored, f2 not; f1 redelivered after f3 (a duplicate, not a reordering);
    # G1's unknown member was never stored; G2's commit timed out and happened.
    delivered = ["n1", "n2", "f1", "f3", "f1", "t1", "g1a", "g2a", "g2b", "n1"]
    result = check(history(sends, delivered, decisions))
    assert result.valid, result.summary()
    assert result.counts == {
        "sent": 13, "acked": 8, "failed": 1, "unknown": 4, "deliveries": 10, "delivered": 8,
        "duplicates": 2, "txns": 3, "txn_groups": 2, "committed": 2, "rolled_back": 1,
        "final_read": 0, "lost": 0, "vanished": 0, "unexpected": 0, "order_violations": 0,
        "txn_partial": 0, "txn_group_partial": 0,
    }  # fmt: skip


def test_an_acknowledged_message_never_delivered_is_lost() -> None:
    result = check(history([send("n1"), send("n2")], ["n1"]))
    assert not result.valid
    assert [e.split(",")[0] for e in result.lost] == ["n2"]
    assert result.counts["lost"] == 1


def test_a_committed_transactions_member_never_delivered_is_lost() -> None:
    result = check(history([send("t1", txn="t1")], [], [decide(True, txn="t1")]))
    assert result.counts["lost"] == 1 and "committed" in result.lost[0]
    # Its commit unacknowledged, it may have been rolled back by a check: not lost.
    assert check(history([send("t1", txn="t1")], [], [decide(True, UNKNOWN, txn="t1")])).valid


def test_a_message_delivered_then_missing_from_the_final_read_vanished() -> None:
    made = history([send("n1"), send("n2"), send("n3", UNKNOWN)], ["n1", "n2", "n3"])
    made.final_read = True
    made.deliver("n1", 0.0, "final", final=True)
    result = check(made)
    assert [e.split(",")[0] for e in result.vanished] == ["n2"], result.summary()
    assert result.counts["vanished"] == 1 and result.counts["final_read"] == 1
    assert result.counts["duplicates"] == 0  # the final read's second sight of n1 is none
    made.deliver("n2", 0.0, "final", final=True)
    assert check(made).valid  # n3 (unknown) need not be there
    # Without a final read nothing can vanish.
    assert check(history([send("n1"), send("n2")], ["n1", "n2"])).valid


@pytest.mark.parametrize(
    ("sends", "decisions", "why"),
    [
        ([], [], "no such send"),
        ([send("n1", FAIL, error="BAD")], [], "failed"),
        ([send("t1", txn="t1")], [decide(False, txn="t1")], "rolled back"),
        ([send("t1", txn="t1")], [], "never committed"),
        ([send("t1", txn="t1")], [decide(True, FAIL, txn="t1")], "never committed"),
        ([send("g1", txn_group="G")], [decide(False, txn_group="G")], "rolled back"),
    ],
)
def test_a_delivery_that_cannot_have_been_sent_is_unexpected(
    sends: list[Send], decisions: list[Decision], why: str
) -> None:
    result = check(history(sends, [sends[0].key if sends else "x"], decisions))
    assert result.counts["unexpected"] == 1, result.summary()
    assert why in result.unexpected[0]


def test_a_message_group_delivered_out_of_acknowledgement_order_is_a_violation() -> None:
    sends = [fifo("f1"), fifo("f2"), fifo("f3")]
    result = check(history(sends, ["f1", "f3", "f2"]))
    assert result.counts["order_violations"] == 1, result.summary()
    assert result.order_violations[0].startswith("f3")


def test_order_binds_only_sends_acknowledged_before_the_next_was_invoked() -> None:
    # Concurrent sends (the second invoked before the first was acknowledged): any order.
    a = Send("a", OK, 1.0, 3.0, producer="p", message_group="g")
    b = Send("b", OK, 2.0, 4.0, producer="p", message_group="g")
    assert check(history([a, b], ["b", "a"])).valid
    # Other producers' or groups' messages are not ordered with each other.
    other = Send("c", OK, 5.0, 6.0, producer="q", message_group="g")
    assert check(history([a, other], ["c", "a"])).valid


def test_a_transaction_group_with_some_acknowledged_members_delivered_is_partial() -> None:
    sends = [
        send("g1", txn_group="G"),
        send("g2", txn_group="G"),
        send("g3", UNKNOWN, txn_group="G"),
    ]
    result = check(history(sends, ["g1"], [decide(True, UNKNOWN, txn_group="G")]))
    assert result.counts["txn_group_partial"] == 1, result.summary()
    assert "g2" in result.partial_groups[0]
    assert result.counts["lost"] == 0  # the commit was not acknowledged: partial, not lost


def test_a_transaction_partly_delivered_is_partial() -> None:
    sends = [send("t1", txn="T"), send("t2", txn="T")]  # two half messages of one transaction
    result = check(history(sends, ["t2"], [decide(True, UNKNOWN, txn="T")]))
    assert result.counts["txn_partial"] == 1, result.summary()


def test_a_unit_committed_and_rolled_back_is_a_contradiction() -> None:
    decisions = [decide(True, txn_group="G"), decide(False, txn_group="G")]
    result = check(history([send("g1", txn_group="G")], ["g1"], decisions))
    assert result.contradictions == ["group G"]
    assert not result.valid


def test_repeated_send_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        check(history([send("a"), send("a")], []))


def test_a_history_survives_a_round_trip_through_a_file(tmp_path: Path) -> None:
    made = history([fifo("f1"), send("t1", UNKNOWN, txn="t1")], ["f1"], [decide(True, txn="t1")])
    made.final_read = True
    made.deliver("f1", 1.0, "final", final=True)
    made.dump(tmp_path / "history.jsonl")
    loaded = History.load(tmp_path / "history.jsonl")
    assert loaded == made
    assert check(loaded).counts == check(made).counts
