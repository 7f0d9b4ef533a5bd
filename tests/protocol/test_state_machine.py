"""The one shape of the house's state machines: every machine's illegal move
is an ``IllegalTransition`` carrying the state and the event (each machine's
own tests walk its legal paths; this one refuses, for all, every move their
tables lack)."""

import pytest

from broker.security import sasl
from coordinator import state as txn_state
from groupcoord import state as group_state
from protocol.state_machine import IllegalTransition, transition
from streaming import lifecycle
from txn import membership


@pytest.mark.parametrize("machine, states, events", [
    (txn_state, txn_state.TxnState, txn_state.TxnEvent),
    (group_state, group_state.GroupState, group_state.GroupEvent),
    (membership, membership.MemberState, membership.MemberEvent),
    (sasl, sasl.SaslState, sasl.SaslEvent),
    (lifecycle, lifecycle.RunnerState, lifecycle.RunnerEvent),
], ids=["transaction", "group", "member", "sasl", "runner"])
def test_every_machine_refuses_a_move_its_table_lacks_with_the_one_error(machine, states, events):
    refused = [(s, e) for s in states for e in events if (s, e) not in machine.TRANSITIONS]
    assert refused
    for state, event in refused:
        with pytest.raises(IllegalTransition) as raised:
            machine.transition(state, event)
        assert (raised.value.state, raised.value.event) == (state, event)
    for (state, event), target in machine.TRANSITIONS.items():
        assert machine.transition(state, event) == target


def test_the_shared_transition_looks_the_table_up():
    table = {("a", "go"): "b"}
    assert transition(table, "a", "go") == "b"
    with pytest.raises(IllegalTransition, match="stop is not allowed in state a"):
        transition(table, "a", "stop")
