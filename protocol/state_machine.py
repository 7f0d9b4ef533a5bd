"""The shape every state machine of the house shares (the transaction
coordinator's, the group coordinator's, a consumer's membership, the
broker's SASL exchange): each keeps its own table ``{(state, event): next
state}`` beside its states, and ``transition()`` looks a move up in it,
raising ``IllegalTransition`` (or the machine's subclass of it) for any move
the table lacks. No I/O, no state of its own.
"""

from __future__ import annotations

import enum


class IllegalTransition(Exception):
    """A move the machine's table does not allow; ``state`` and ``event`` say which."""

    def __init__(self, state, event):
        self.state = state
        self.event = event
        super().__init__(f"{_name(event)} is not allowed in state {_name(state)}")


def transition(table: dict, state, event, error: type[IllegalTransition] = IllegalTransition):
    """``table[(state, event)]``: the state after ``event`` in ``state``;
    raises ``error(state, event)`` if the table has no such move."""
    try:
        return table[(state, event)]
    except KeyError:
        raise error(state, event) from None


def _name(value) -> str:
    return str(value.value) if isinstance(value, enum.Enum) and isinstance(value.value, str) else getattr(value, "name", str(value))
