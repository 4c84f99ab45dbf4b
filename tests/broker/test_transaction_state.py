import pytest

from halfmoon.broker.transaction_state import (
    TransactionAlreadyEnded,
    TransactionStateError,
    TxnEvent,
    TxnState,
    changes_state,
    legal_events,
    next_state,
)

P, C, R, K = TxnState.PREPARED, TxnState.COMMITTED, TxnState.ROLLED_BACK, TxnState.PARKED


@pytest.mark.parametrize(
    ("state", "event", "expected"),
    [
        (P, TxnEvent.COMMIT, C),
        (P, TxnEvent.ROLLBACK, R),
        (P, TxnEvent.UNKNOWN, P),
        (P, TxnEvent.CHECK_SENT, P),
        (P, TxnEvent.PARK, K),
        (K, TxnEvent.RESUME, P),
        (K, TxnEvent.COMMIT, C),
        (K, TxnEvent.ROLLBACK, R),
    ],
)
def test_legal_moves(state, event, expected):
    assert next_state(state, event) is expected


def test_repeating_a_decision_is_a_no_op():
    assert next_state(C, TxnEvent.COMMIT) is C
    assert next_state(R, TxnEvent.ROLLBACK) is R
    assert not changes_state(C, TxnEvent.COMMIT)
    assert not changes_state(R, TxnEvent.ROLLBACK)


def test_unknown_after_a_decision_keeps_the_decision():
    assert next_state(C, TxnEvent.UNKNOWN) is C
    assert next_state(R, TxnEvent.UNKNOWN) is R


def test_ending_the_opposite_way_is_a_clear_error():
    with pytest.raises(TransactionAlreadyEnded) as exc:
        next_state(C, TxnEvent.ROLLBACK, transaction_id="tx-1")
    assert exc.value.code == "TRANSACTION_ALREADY_ENDED"
    assert "tx-1" in exc.value.message and "committed" in exc.value.message
    with pytest.raises(TransactionAlreadyEnded):
        next_state(R, TxnEvent.COMMIT)


@pytest.mark.parametrize("state", [C, R])
@pytest.mark.parametrize("event", [TxnEvent.CHECK_SENT, TxnEvent.PARK, TxnEvent.RESUME])
def test_a_decided_transaction_is_never_checked_or_parked(state, event):
    with pytest.raises(TransactionStateError) as exc:
        next_state(state, event)
    assert not isinstance(exc.value, TransactionAlreadyEnded)


def test_parked_transactions_are_not_checked_until_resumed():
    with pytest.raises(TransactionStateError):
        next_state(K, TxnEvent.CHECK_SENT)
    assert TxnEvent.CHECK_SENT in legal_events(P)
    assert TxnEvent.CHECK_SENT not in legal_events(K)


def test_every_pair_is_either_legal_or_a_typed_error():
    for state in TxnState:
        for event in TxnEvent:
            try:
                result = next_state(state, event)
            except TransactionStateError:
                assert event not in legal_events(state)
            else:
                assert isinstance(result, TxnState)
                assert event in legal_events(state)
