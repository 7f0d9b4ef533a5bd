"""The transaction state table accepts exactly Kafka's transitions (every
move it lacks is refused: tests/protocol/test_state_machine.py)."""

import pytest

from coordinator.state import InvalidTransition, TxnEvent, TxnState, transition
from tests.helpers import walk


def test_happy_paths():
    walk(transition, TxnState.EMPTY, [
        (TxnEvent.ADD_PARTITIONS, TxnState.ONGOING),
        (TxnEvent.ADD_PARTITIONS, TxnState.ONGOING),
        (TxnEvent.COMMIT, TxnState.PREPARE_COMMIT),
        (TxnEvent.MARKERS_WRITTEN, TxnState.COMPLETE_COMMIT),
        (TxnEvent.ADD_PARTITIONS, TxnState.ONGOING),
        (TxnEvent.ABORT, TxnState.PREPARE_ABORT),
        (TxnEvent.MARKERS_WRITTEN, TxnState.COMPLETE_ABORT),
        (TxnEvent.INIT_PRODUCER_ID, TxnState.EMPTY),
    ])


def test_fencing_path():
    state = transition(TxnState.ONGOING, TxnEvent.FENCE)
    assert state == TxnState.PREPARE_EPOCH_FENCE
    assert transition(state, TxnEvent.ABORT) == TxnState.PREPARE_ABORT


def test_a_decision_is_never_reversed():
    for decided in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
        for event in (TxnEvent.COMMIT, TxnEvent.ABORT):
            with pytest.raises(InvalidTransition):
                transition(decided, event)


def test_dead_is_final():
    for event in TxnEvent:
        with pytest.raises(InvalidTransition):
            transition(TxnState.DEAD, event)
