"""The runner's lifecycle: every state an app instance can be in, every event
that moves it, one table.

As in ``coordinator.state``, through the same ``protocol.state_machine``:
everything that decides whether the runner may move from one state to
another lives in ``TRANSITIONS``; a (state, event) pair missing from it is a
bug in the runner, and ``transition()`` raises ``InvalidTransition`` (an
``IllegalTransition``) rather than let the instance carry on in a state
nobody thought about. This module knows nothing of clients, stores or
clocks; ``streaming.runner`` feeds it the events as they happen.

    STARTING --assigned--> RESTORING --restored--> RUNNING <--committed/aborted-- COMMITTING
                                ^                    |  --commit-->
                                |                    |
                                +--assigned-- REBALANCING <--revoked/lost--+

    any live state --stop--> STOPPING --closed--> STOPPED
    any live state --fenced--> FENCED       any live state --failed--> FAILED

The open transaction is not a state of its own: records are processed in
RUNNING inside it, and COMMITTING is the commit (output, changelog and
offsets in one Kafka transaction) until it has an outcome. A revocation
commits first (RUNNING -> COMMITTING -> RUNNING), then revokes; a loss
aborts in REBALANCING (the partitions may be someone else's already).
FENCED and FAILED are final: the instance writes nothing more, and the
revocations that closing the consumer reports there change nothing.
"""

from __future__ import annotations

import enum

from protocol import state_machine
from protocol.state_machine import IllegalTransition


class RunnerState(enum.Enum):
    STARTING = "starting"  # topics checked, producer initialized, subscribed; nothing assigned yet
    RESTORING = "restoring"  # partitions assigned: their store shards are caught up with their changelogs
    RUNNING = "running"  # records are processed inside the open transaction
    COMMITTING = "committing"  # the open transaction is being committed (or aborted)
    REBALANCING = "rebalancing"  # partitions revoked or lost, the next assignment not here yet
    STOPPING = "stopping"  # asked to stop: the open transaction was settled, the clients close
    STOPPED = "stopped"
    FENCED = "fenced"  # another producer took the transactional id: nothing more is written
    FAILED = "failed"  # a record failed under on_error="stop", or an error ended the run

    @property
    def is_final(self) -> bool:
        return self in (RunnerState.STOPPED, RunnerState.FENCED, RunnerState.FAILED)


class RunnerEvent(enum.Enum):
    ASSIGNED = "assigned"
    RESTORED = "restored"
    COMMIT = "commit"
    COMMITTED = "committed"
    ABORTED = "aborted"  # the commit failed: aborted (or settled by a new producer) and rewound
    REVOKED = "revoked"
    LOST = "lost"
    STOP = "stop"
    CLOSED = "closed"
    FENCE = "fence"
    FAIL = "fail"


S, E = RunnerState, RunnerEvent

LIVE = (S.STARTING, S.RESTORING, S.RUNNING, S.COMMITTING, S.REBALANCING, S.STOPPING)

# (current state, event) -> next state. Nothing else is allowed.
TRANSITIONS: dict[tuple[RunnerState, RunnerEvent], RunnerState] = {
    (S.STARTING, E.ASSIGNED): S.RESTORING,
    (S.RESTORING, E.RESTORED): S.RUNNING,
    (S.RUNNING, E.COMMIT): S.COMMITTING,
    (S.COMMITTING, E.COMMITTED): S.RUNNING,
    (S.COMMITTING, E.ABORTED): S.RUNNING,
    # Partitions added to those held (an assignment without a revocation first).
    (S.RUNNING, E.ASSIGNED): S.RESTORING,
    (S.RUNNING, E.REVOKED): S.REBALANCING,
    (S.RUNNING, E.LOST): S.REBALANCING,
    (S.REBALANCING, E.REVOKED): S.REBALANCING,
    (S.REBALANCING, E.LOST): S.REBALANCING,
    (S.REBALANCING, E.ASSIGNED): S.RESTORING,
    # A stop asked for between polls, whatever the group was doing (a
    # restore or a rebalance cut short by the stop itself included).
    (S.STARTING, E.STOP): S.STOPPING,
    (S.RESTORING, E.STOP): S.STOPPING,
    (S.RUNNING, E.STOP): S.STOPPING,
    (S.REBALANCING, E.STOP): S.STOPPING,
    # Closing the consumer revokes what it holds.
    (S.STOPPING, E.REVOKED): S.STOPPING,
    (S.STOPPING, E.LOST): S.STOPPING,
    (S.STOPPING, E.CLOSED): S.STOPPED,
    (S.FENCED, E.REVOKED): S.FENCED,
    (S.FENCED, E.LOST): S.FENCED,
    (S.FAILED, E.REVOKED): S.FAILED,
    (S.FAILED, E.LOST): S.FAILED,
    # Under a cooperative assignor a member revokes some partitions and keeps
    # processing the rest before the rebalance's assignment comes: a commit
    # due meanwhile is an ordinary one. So is the commit on the way out when
    # a stop cut an added partitions' restore short.
    (S.REBALANCING, E.COMMIT): S.COMMITTING,
    (S.RESTORING, E.COMMIT): S.COMMITTING,
    # Fenced wherever a producer call can find out (a commit, an abort, a new
    # producer's init_transactions); failed wherever an error ends the run.
    **{(state, E.FENCE): S.FENCED for state in LIVE},
    **{(state, E.FAIL): S.FAILED for state in LIVE},
}


class InvalidTransition(IllegalTransition):
    """A runner move the table does not allow: a bug in the runner."""


def transition(state: RunnerState, event: RunnerEvent) -> RunnerState:
    """The state after ``event`` in ``state``; raises InvalidTransition if illegal."""
    return state_machine.transition(TRANSITIONS, state, event, InvalidTransition)


def allowed_events(state: RunnerState) -> set[RunnerEvent]:
    return {event for (source, event) in TRANSITIONS if source == state}
