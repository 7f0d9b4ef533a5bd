"""The group state table accepts exactly the classic protocol's transitions."""

import pytest

from groupcoord.state import TRANSITIONS, GroupEvent, GroupState, InvalidGroupTransition, transition
from tests.helpers import walk

S, E = GroupState, GroupEvent

# Kafka's GroupState.validPreviousStates (classic groups), for the targets we reach.
KAFKA_PREVIOUS = {
    S.PREPARING_REBALANCE: {S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY},
    S.COMPLETING_REBALANCE: {S.PREPARING_REBALANCE},
    S.STABLE: {S.COMPLETING_REBALANCE},
    S.EMPTY: {S.PREPARING_REBALANCE},
    S.DEAD: {S.STABLE, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.EMPTY, S.DEAD},
}


def test_a_group_lives_through_a_rebalance_and_is_deleted():
    walk(transition, S.EMPTY, [
        (E.MEMBER_JOIN, S.PREPARING_REBALANCE),
        (E.MEMBER_JOIN, S.PREPARING_REBALANCE),
        (E.JOIN_COMPLETE, S.COMPLETING_REBALANCE),
        (E.LEADER_SYNC, S.STABLE),
        (E.MEMBER_LEAVE, S.PREPARING_REBALANCE),
        (E.JOIN_COMPLETE, S.COMPLETING_REBALANCE),
        (E.MEMBER_JOIN, S.PREPARING_REBALANCE),
        (E.ALL_MEMBERS_GONE, S.EMPTY),
        (E.DELETE, S.DEAD),
    ])


def test_every_move_is_one_kafka_allows_or_the_last_member_leaving():
    """Kafka empties a group only through PreparingRebalance; we take the
    direct step when the last member leaves (no one is left to rejoin)."""
    for (source, event), target in TRANSITIONS.items():
        if event == E.ALL_MEMBERS_GONE:
            assert target == S.EMPTY
            continue
        assert source in KAFKA_PREVIOUS[target] or source == target == S.PREPARING_REBALANCE, (source, event, target)


def test_only_a_completing_rebalance_takes_an_assignment():
    assert [s for s in S if (s, E.LEADER_SYNC) in TRANSITIONS] == [S.COMPLETING_REBALANCE]


def test_only_an_empty_group_is_deleted_and_dead_is_final():
    assert [s for s in S if (s, E.DELETE) in TRANSITIONS] == [S.EMPTY]
    for event in E:
        with pytest.raises(InvalidGroupTransition):
            transition(S.DEAD, event)
