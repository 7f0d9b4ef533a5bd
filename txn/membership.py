"""A consumer's membership in a classic (JoinGroup/SyncGroup) consumer group,
as one state table, without I/O.

The consumer's driver sends the requests; this class says what state the
member is in, which request comes next, and what the partitions it owns are
after each step. Two rebalance protocols (KIP-429):

- EAGER: before (re)joining, the member gives up everything it owns
  (``on_partitions_revoked`` with all of them), then takes the new assignment.
- COOPERATIVE: the member keeps what it owns while it rejoins; after the
  sync it revokes only what it lost and, if it lost anything, rejoins at once
  so the partitions can move to their new owner in the next round.

The protocol is the one every configured assignor supports (Kafka's rule),
so the default ``range, cooperative-sticky`` list runs EAGER until ``range``
is dropped from it.
"""

from __future__ import annotations

import enum

import attrs

from protocol import state_machine
from protocol.state_machine import IllegalTransition
from txn.types import TopicPartition


class MemberState(enum.Enum):
    UNJOINED = "unjoined"  # no member id or generation, owns nothing it may commit for
    JOINING = "joining"  # JoinGroup sent or to be sent
    SYNCING = "syncing"  # joined a generation, waiting for its assignment
    STABLE = "stable"  # has its assignment, heartbeats


class MemberEvent(enum.Enum):
    JOIN = "join"  # subscribe, or a rebalance was announced
    JOINED = "joined"  # JoinGroup answered with a generation
    SYNCED = "synced"  # SyncGroup answered with the assignment
    REBALANCE = "rebalance"  # REBALANCE_IN_PROGRESS from a heartbeat, commit or sync
    FENCED = "fenced"  # UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION / FENCED_INSTANCE_ID
    LEAVE = "leave"  # unsubscribe, close, or max.poll.interval.ms passed


S, E = MemberState, MemberEvent

# (current state, event) -> next state. Nothing else is allowed.
TRANSITIONS: dict[tuple[MemberState, MemberEvent], MemberState] = {
    (S.UNJOINED, E.JOIN): S.JOINING,
    (S.JOINING, E.JOIN): S.JOINING,
    (S.JOINING, E.JOINED): S.SYNCING,
    (S.JOINING, E.REBALANCE): S.JOINING,
    (S.SYNCING, E.SYNCED): S.STABLE,
    (S.SYNCING, E.REBALANCE): S.JOINING,
    (S.STABLE, E.JOIN): S.JOINING,
    (S.STABLE, E.REBALANCE): S.JOINING,
    (S.JOINING, E.FENCED): S.JOINING,
    (S.SYNCING, E.FENCED): S.JOINING,
    (S.STABLE, E.FENCED): S.JOINING,
    (S.UNJOINED, E.LEAVE): S.UNJOINED,
    (S.JOINING, E.LEAVE): S.UNJOINED,
    (S.SYNCING, E.LEAVE): S.UNJOINED,
    (S.STABLE, E.LEAVE): S.UNJOINED,
}


class IllegalMemberTransition(IllegalTransition):
    """A step the table does not allow: a bug in the consumer's driver."""


def transition(state: MemberState, event: MemberEvent) -> MemberState:
    """The state after ``event`` in ``state``; raises IllegalMemberTransition if illegal."""
    return state_machine.transition(TRANSITIONS, state, event, IllegalMemberTransition)


@attrs.frozen
class RebalanceStep:
    """What the consumer tells its listener after a step, in this order."""

    revoked: frozenset = frozenset()  # give up cleanly (commit first)
    lost: frozenset = frozenset()  # already someone else's: do not commit
    assigned: frozenset = frozenset()
    rejoin: bool = False
    completes_rebalance: bool = False  # the listener hears "assigned" even when nothing is new


@attrs.define
class GroupMember:
    group_id: str
    cooperative: bool
    group_instance_id: str | None = None
    state: MemberState = MemberState.UNJOINED
    member_id: str = ""
    generation_id: int = -1
    owned: frozenset = frozenset()

    def apply(self, event: MemberEvent) -> MemberState:
        self.state = transition(self.state, event)
        return self.state

    def start_join(self) -> RebalanceStep:
        """Before JoinGroup: eager members revoke everything they own."""
        self.apply(MemberEvent.JOIN)
        if self.cooperative or not self.owned:
            return RebalanceStep()
        revoked, self.owned = self.owned, frozenset()
        return RebalanceStep(revoked=revoked)

    def joined(self, member_id: str, generation_id: int) -> None:
        self.apply(MemberEvent.JOINED)
        self.member_id, self.generation_id = member_id, generation_id

    def synced(self, assigned: list[TopicPartition]) -> RebalanceStep:
        """After SyncGroup: what to revoke, what is new, whether to rejoin."""
        self.apply(MemberEvent.SYNCED)
        assigned = frozenset(assigned)
        revoked = self.owned - assigned
        added = assigned - self.owned
        self.owned = assigned
        return RebalanceStep(revoked=revoked, assigned=added, rejoin=self.cooperative and bool(revoked), completes_rebalance=True)

    def fenced(self, *, forget_member_id: bool) -> RebalanceStep:
        """The coordinator no longer knows us in this generation: what we
        owned is lost (someone else may own it already)."""
        self.apply(MemberEvent.FENCED)
        lost, self.owned = self.owned, frozenset()
        self.generation_id = -1
        if forget_member_id:
            self.member_id = ""
        return RebalanceStep(lost=lost)

    def rebalance(self) -> None:
        self.apply(MemberEvent.REBALANCE)

    def leave(self) -> RebalanceStep:
        self.apply(MemberEvent.LEAVE)
        revoked, self.owned = self.owned, frozenset()
        self.generation_id = -1
        self.member_id = ""
        return RebalanceStep(revoked=revoked)
