"""streaming.lifecycle: the runner's one transition table, walked the way
the runner walks it, and refusing what it must refuse."""

from __future__ import annotations

import pytest

from protocol.state_machine import IllegalTransition
from streaming.lifecycle import LIVE, TRANSITIONS, InvalidTransition, RunnerEvent, RunnerState, allowed_events, transition

S, E = RunnerState, RunnerEvent


def walk(*events: RunnerEvent, start: RunnerState = S.STARTING) -> RunnerState:
    state = start
    for event in events:
        state = transition(state, event)
    return state


def test_a_run_assigns_restores_commits_rebalances_and_stops():
    assert walk(E.ASSIGNED, E.RESTORED) is S.RUNNING
    assert walk(E.ASSIGNED, E.RESTORED, E.COMMIT) is S.COMMITTING
    assert walk(E.ASSIGNED, E.RESTORED, E.COMMIT, E.COMMITTED) is S.RUNNING
    assert walk(E.ASSIGNED, E.RESTORED, E.COMMIT, E.ABORTED) is S.RUNNING
    # A revocation commits first, then revokes; the assignment restores again.
    assert walk(E.ASSIGNED, E.RESTORED, E.COMMIT, E.COMMITTED, E.REVOKED, E.ASSIGNED, E.RESTORED) is S.RUNNING
    assert walk(E.ASSIGNED, E.RESTORED, E.LOST, E.ASSIGNED, E.RESTORED) is S.RUNNING
    # Closing the consumer on the way out revokes what it holds.
    assert walk(E.ASSIGNED, E.RESTORED, E.STOP, E.REVOKED, E.CLOSED) is S.STOPPED


@pytest.mark.parametrize("state", LIVE)
def test_fencing_and_failure_end_every_live_state_for_good(state):
    for event, final in ((E.FENCE, S.FENCED), (E.FAIL, S.FAILED)):
        reached = transition(state, event)
        assert reached is final and reached.is_final
        # The revocations of closing the consumer change nothing there...
        assert transition(reached, E.REVOKED) is final and transition(reached, E.LOST) is final
        # ...and nothing else happens any more: no commit, no assignment, no stop.
        assert allowed_events(reached) == {E.REVOKED, E.LOST}


@pytest.mark.parametrize(("state", "event"), [
    (S.STARTING, E.COMMIT),  # nothing assigned: no transaction to commit
    (S.STARTING, E.RESTORED),
    (S.RUNNING, E.COMMITTED),  # an outcome without a commit
    (S.COMMITTING, E.REVOKED),  # a commit is not interrupted by a rebalance (the consumer calls back inside poll)
    (S.COMMITTING, E.STOP),
    (S.STOPPING, E.COMMIT),  # the open transaction is settled before the stop
    (S.STOPPING, E.ASSIGNED),
    (S.STOPPED, E.CLOSED),
    (S.FENCED, E.COMMIT),
    (S.FAILED, E.ASSIGNED),
])
def test_what_the_table_lacks_is_refused(state, event):
    with pytest.raises(InvalidTransition, match=f"^{event.value} is not allowed in state {state.value}$") as raised:
        transition(state, event)
    assert isinstance(raised.value, IllegalTransition) and (raised.value.state, raised.value.event) == (state, event)


def test_every_state_but_stopped_can_be_reached_and_every_live_state_left():
    reachable = {S.STARTING}
    frontier = [S.STARTING]
    while frontier:
        state = frontier.pop()
        for event in allowed_events(state):
            following = TRANSITIONS[(state, event)]
            if following not in reachable:
                reachable.add(following)
                frontier.append(following)
    assert reachable == set(RunnerState)
    for state in LIVE:
        assert allowed_events(state), state
    assert allowed_events(S.STOPPED) == set()
