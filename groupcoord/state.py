"""The classic consumer-group state machine: every state, every event, one table.

As with ``coordinator.state``: a (state, event) pair missing from
``TRANSITIONS`` is illegal and ``transition()`` raises; this module knows
nothing of members, timers or logs. The group coordinator decides which
event happened (a join, a sync from the leader, a member's session expiring)
and asks here where the group goes next.

    Empty --join--> PreparingRebalance --all joined--> CompletingRebalance
      ^                 ^      |                          |
      |                 |      +--all left--> Empty       +--leader sync--> Stable
      |                 +------ join / leave / expire -----------------------+
    Dead <-- delete (from Empty), or its offsets partition moves away
"""

from __future__ import annotations

import enum

from protocol import state_machine
from protocol.state_machine import IllegalTransition


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class GroupEvent(enum.Enum):
    MEMBER_JOIN = "member joins or rejoins with new metadata"
    JOIN_COMPLETE = "every known member has joined (or the rebalance timeout passed)"
    LEADER_SYNC = "the leader's SyncGroup delivered the assignment"
    MEMBER_LEAVE = "a member left or its session expired"
    ALL_MEMBERS_GONE = "no member is left"
    DELETE = "DeleteGroups, or all offsets expired"


S, E = GroupState, GroupEvent

TRANSITIONS: dict[tuple[GroupState, GroupEvent], GroupState] = {
    (S.EMPTY, E.MEMBER_JOIN): S.PREPARING_REBALANCE,
    (S.EMPTY, E.DELETE): S.DEAD,
    (S.EMPTY, E.ALL_MEMBERS_GONE): S.EMPTY,
    (S.PREPARING_REBALANCE, E.MEMBER_JOIN): S.PREPARING_REBALANCE,
    (S.PREPARING_REBALANCE, E.MEMBER_LEAVE): S.PREPARING_REBALANCE,
    (S.PREPARING_REBALANCE, E.JOIN_COMPLETE): S.COMPLETING_REBALANCE,
    (S.PREPARING_REBALANCE, E.ALL_MEMBERS_GONE): S.EMPTY,
    (S.COMPLETING_REBALANCE, E.LEADER_SYNC): S.STABLE,
    (S.COMPLETING_REBALANCE, E.MEMBER_JOIN): S.PREPARING_REBALANCE,
    (S.COMPLETING_REBALANCE, E.MEMBER_LEAVE): S.PREPARING_REBALANCE,
    (S.COMPLETING_REBALANCE, E.ALL_MEMBERS_GONE): S.EMPTY,
    (S.STABLE, E.MEMBER_JOIN): S.PREPARING_REBALANCE,
    (S.STABLE, E.MEMBER_LEAVE): S.PREPARING_REBALANCE,
    (S.STABLE, E.ALL_MEMBERS_GONE): S.EMPTY,
}


class InvalidGroupTransition(IllegalTransition):
    """A group move the table does not allow."""


def transition(state: GroupState, event: GroupEvent) -> GroupState:
    """The state after ``event`` in ``state``; raises InvalidGroupTransition if illegal."""
    return state_machine.transition(TRANSITIONS, state, event, InvalidGroupTransition)
