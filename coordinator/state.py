"""The transaction state machine: every state, every event, one table.

Two rules, in the manner of h11's state module:

- Everything that decides whether a transactional id may move from one state
  to another lives here, in ``TRANSITIONS``. A (state, event) pair missing
  from the table is illegal and ``transition()`` raises ``InvalidTransition``;
  the coordinator maps that to the error code a client expects.
- This module knows nothing of logs, sockets or clocks: the coordinator asks
  it for the next state, writes that state to ``__transaction_state``, and
  only then applies it (write-then-apply is the durability rule).

States and their numbers in ``TransactionLogValue.TransactionStatus`` are
Kafka's.
"""

from __future__ import annotations

import enum

from protocol import state_machine
from protocol.state_machine import IllegalTransition


class TxnState(enum.IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def is_prepare(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def is_complete(self) -> bool:
        return self in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


# Kafka's names of the states, as ListTransactions and DescribeTransactions
# carry them (and as logs, metrics and ``onceflow status`` show them).
STATE_NAMES = {
    TxnState.EMPTY: "Empty",
    TxnState.ONGOING: "Ongoing",
    TxnState.PREPARE_COMMIT: "PrepareCommit",
    TxnState.PREPARE_ABORT: "PrepareAbort",
    TxnState.COMPLETE_COMMIT: "CompleteCommit",
    TxnState.COMPLETE_ABORT: "CompleteAbort",
    TxnState.DEAD: "Dead",
    TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}


class TxnEvent(enum.Enum):
    INIT_PRODUCER_ID = "InitProducerId"  # a (re)started producer: bump epoch, start clean
    ADD_PARTITIONS = "AddPartitionsToTxn"  # also AddOffsetsToTxn (adds the offsets partition)
    COMMIT = "EndTxn(commit)"
    ABORT = "EndTxn(abort)"
    MARKERS_WRITTEN = "markers written"  # every partition has its COMMIT/ABORT marker
    FENCE = "fence"  # InitProducerId or timeout finds the transaction Ongoing
    EXPIRE = "expire"  # transactional.id.expiration.ms without use
    ABORT_NOTHING_ADDED = "EndTxn(abort) with no partition added"  # KIP-890 part 2 only
    SEAL = "seal"  # onceflow: the transaction's data made durable and recorded, so an unclean stop spares it
    ABORT_ENDED = "abort of a transaction found only in a partition"  # onceflow: at start, its AddPartitions record lost
    FENCE_ENDED = "fence after an unclean stop"  # onceflow: an ended id's epoch, which a transaction the stop took back may have run at


S, E = TxnState, TxnEvent

# (current state, event) -> next state. Nothing else is allowed.
TRANSITIONS: dict[tuple[TxnState, TxnEvent], TxnState] = {
    (S.EMPTY, E.INIT_PRODUCER_ID): S.EMPTY,
    (S.COMPLETE_COMMIT, E.INIT_PRODUCER_ID): S.EMPTY,
    (S.COMPLETE_ABORT, E.INIT_PRODUCER_ID): S.EMPTY,
    (S.EMPTY, E.ADD_PARTITIONS): S.ONGOING,
    (S.ONGOING, E.ADD_PARTITIONS): S.ONGOING,
    (S.COMPLETE_COMMIT, E.ADD_PARTITIONS): S.ONGOING,
    (S.COMPLETE_ABORT, E.ADD_PARTITIONS): S.ONGOING,
    (S.ONGOING, E.COMMIT): S.PREPARE_COMMIT,
    (S.ONGOING, E.ABORT): S.PREPARE_ABORT,
    (S.PREPARE_EPOCH_FENCE, E.ABORT): S.PREPARE_ABORT,
    # KIP-890 part 2 only (the coordinator refuses it to older clients): an
    # abort with no partition added still bumps the epoch, fencing a Produce
    # of the transaction still on its way (a new decision, not the last one reversed).
    (S.EMPTY, E.ABORT_NOTHING_ADDED): S.PREPARE_ABORT,
    (S.COMPLETE_COMMIT, E.ABORT_NOTHING_ADDED): S.PREPARE_ABORT,
    (S.COMPLETE_ABORT, E.ABORT_NOTHING_ADDED): S.PREPARE_ABORT,
    (S.ONGOING, E.FENCE): S.PREPARE_EPOCH_FENCE,
    # onceflow's seal (``transaction.durable.at.end``): still open, its data
    # durable up to the ends the record names (``TxnMetadata.data_ends``).
    (S.ONGOING, E.SEAL): S.ONGOING,
    # onceflow, at start: a partition holds a batch of the producer at this
    # epoch that no transaction names (a power cut took back the record that
    # added it): the transaction it began is aborted, with an epoch bump.
    (S.EMPTY, E.ABORT_ENDED): S.PREPARE_ABORT,
    (S.COMPLETE_COMMIT, E.ABORT_ENDED): S.PREPARE_ABORT,
    (S.COMPLETE_ABORT, E.ABORT_ENDED): S.PREPARE_ABORT,
    # onceflow (``transaction.durable.at.end``, after an unclean stop): the
    # epoch moves on with no transaction open, and no retry may match the old one.
    (S.EMPTY, E.FENCE_ENDED): S.EMPTY,
    (S.COMPLETE_COMMIT, E.FENCE_ENDED): S.COMPLETE_COMMIT,
    (S.COMPLETE_ABORT, E.FENCE_ENDED): S.COMPLETE_ABORT,
    (S.PREPARE_COMMIT, E.MARKERS_WRITTEN): S.COMPLETE_COMMIT,
    (S.PREPARE_ABORT, E.MARKERS_WRITTEN): S.COMPLETE_ABORT,
    (S.EMPTY, E.EXPIRE): S.DEAD,
    (S.COMPLETE_COMMIT, E.EXPIRE): S.DEAD,
    (S.COMPLETE_ABORT, E.EXPIRE): S.DEAD,
}


class InvalidTransition(IllegalTransition):
    """A transaction move the table does not allow."""


def transition(state: TxnState, event: TxnEvent) -> TxnState:
    """The state after ``event`` in ``state``; raises InvalidTransition if illegal."""
    return state_machine.transition(TRANSITIONS, state, event, InvalidTransition)
