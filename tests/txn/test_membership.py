"""The consumer's membership table, and what each step tells the listener."""

import pytest

from tests.helpers import walk
from txn.membership import TRANSITIONS, GroupMember, MemberEvent, MemberState, transition
from txn.types import TopicPartition

S, E = MemberState, MemberEvent
A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def test_a_member_joins_syncs_rebalances_and_leaves():
    walk(transition, S.UNJOINED, [
        (E.JOIN, S.JOINING),
        (E.JOINED, S.SYNCING),
        (E.SYNCED, S.STABLE),
        (E.REBALANCE, S.JOINING),
        (E.JOINED, S.SYNCING),
        (E.REBALANCE, S.JOINING),
        (E.JOINED, S.SYNCING),
        (E.FENCED, S.JOINING),
        (E.JOINED, S.SYNCING),
        (E.SYNCED, S.STABLE),
        (E.LEAVE, S.UNJOINED),
    ])


def test_leave_works_from_anywhere_and_only_leave_unjoins():
    for state in S:
        assert transition(state, E.LEAVE) == S.UNJOINED
    assert {event for (_s, event), target in TRANSITIONS.items() if target == S.UNJOINED} == {E.LEAVE}


def test_only_a_joined_member_takes_an_assignment():
    assert [s for s in S if (s, E.SYNCED) in TRANSITIONS] == [S.SYNCING]
    assert [s for s in S if (s, E.JOINED) in TRANSITIONS] == [S.JOINING]


def stable(member, partitions):
    member.start_join()
    member.joined("m-1", 1)
    return member.synced(partitions)


def test_an_eager_member_gives_up_everything_before_it_rejoins():
    member = GroupMember("g", cooperative=False)
    first = stable(member, [A0, A1])
    assert first.assigned == {A0, A1} and first.completes_rebalance and not first.rejoin
    step = member.start_join()
    assert step.revoked == {A0, A1} and member.owned == frozenset()
    member.joined("m-1", 2)
    step = member.synced([A1, B0])
    assert (step.revoked, step.assigned, step.rejoin) == (frozenset(), {A1, B0}, False)


def test_a_cooperative_member_keeps_what_it_owns_and_rejoins_after_losing_some():
    member = GroupMember("g", cooperative=True)
    stable(member, [A0, A1])
    assert member.start_join().revoked == frozenset() and member.owned == {A0, A1}
    member.joined("m-1", 2)
    step = member.synced([A1])
    assert (step.revoked, step.assigned, step.rejoin) == ({A0}, frozenset(), True), "A0 moves in the next round"


def test_fencing_loses_the_partitions_and_leaving_revokes_them():
    member = GroupMember("g", cooperative=False)
    stable(member, [A0])
    step = member.fenced(forget_member_id=False)
    assert step.lost == {A0} and step.revoked == frozenset()
    assert (member.state, member.member_id, member.generation_id) == (S.JOINING, "m-1", -1), "ILLEGAL_GENERATION keeps the member id"
    member.joined("m-1", 2)
    member.synced([B0])
    step = member.leave()
    assert step.revoked == {B0} and (member.state, member.member_id) == (S.UNJOINED, "")
