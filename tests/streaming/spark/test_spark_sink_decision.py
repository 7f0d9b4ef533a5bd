"""The sink's commit protocol without I/O: the decision table, the naming of
transactional ids, the decision record's format."""

from __future__ import annotations

import pickle

import pytest

from streaming.spark.decision import (
    Decision,
    HandleState,
    all_aborted,
    dead_handles,
    driver_transactional_id,
    not_open_message,
    PrefixInUseError,
    SinkError,
    SinkTransaction,
    leftovers,
    lost_message,
    plan_abort,
    plan_commit,
    query_prefix,
    still_to_commit,
    transactional_id,
)

Q, OTHER = "6f1c0d2e-0000-4000-8000-000000000001", "99999999-0000-4000-8000-000000000002"
OLD = (SinkTransaction("p-old-0", 7, 0, ("out-0",), 3), SinkTransaction("p-old-1", 8, 0, ("out-1",), 2))
NEW = (SinkTransaction("p-new-0", 9, 0, ("out-0", "out-1"), 5),)


@pytest.mark.parametrize(
    "latest, batch, reason, decided, committed",
    [
        (None, 0, "decide", NEW, NEW),  # first batch ever
        (Decision(Q, 4, "run1", OLD), 5, "decide", NEW, NEW),  # the next batch
        (Decision(Q, 5, "run1", OLD), 5, "recommit", None, OLD),  # replayed after a crash after the decision: the old handles, not the new
        (Decision(Q, 6, "run1", OLD), 5, "done", None, ()),  # already superseded: nothing to commit
    ],
)
def test_plan_commit(latest, batch, reason, decided, committed):
    plan = plan_commit(latest, Q, batch, "run2", NEW)
    assert plan.reason == reason
    assert plan.commit == committed
    if decided is None:
        assert plan.decide is None
    else:
        assert plan.decide == Decision(Q, batch, "run2", decided)


def test_plan_commit_refuses_another_querys_prefix():
    with pytest.raises(PrefixInUseError, match=f"in use by query {OTHER}.*its own transactionalIdPrefix"):
        plan_commit(Decision(OTHER, 3, "r", OLD), Q, 0, "run2", NEW)


@pytest.mark.parametrize(
    "latest, finish, abort",
    [
        (None, (), NEW),
        (Decision(Q, 4, "run1", OLD), (), NEW),
        (Decision(Q, 5, "run1", OLD), OLD, NEW),  # decided: finished, never aborted
        (Decision(Q, 5, "run1", NEW), NEW, ()),  # commit raised after deciding these very handles
        (Decision(OTHER, 5, "run1", OLD), (), ()),  # another query's latest: this driver cannot tell what is decided, so aborts nothing
    ],
)
def test_plan_abort_never_undoes_a_decision(latest, finish, abort):
    plan = plan_abort(latest, Q, 5, NEW)
    assert plan.finish == finish
    assert plan.abort == abort


def test_transactional_ids_unique_per_run_batch_partition_and_task_attempt():
    a = transactional_id("job", Q, "1b424c33-32d3-4289", 7, 3)
    assert a == "job-6f1c0d2e0000-1b424c33-7-3"
    assert transactional_id("job", Q, "1b424c33-32d3-4289", 7, 3, 1) == a + "-a1"
    assert transactional_id("job", Q, "1b424c33-32d3-4289", 7, 3, 0, 4711) == a + "-t4711"  # Spark's taskAttemptId: one per attempt, across stage attempts
    assert transactional_id("job", Q, "1b424c33-32d3-4289", 8, 3) != a  # the next batch: a zombie of batch 7 can never fence it
    assert transactional_id("job", Q, "ffff0000-32d3", 7, 3) != a  # a restart never reuses a name
    assert a.startswith(query_prefix("job", Q))
    assert not transactional_id("job", OTHER, "1b424c33", 7, 3).startswith(query_prefix("job", Q))
    assert driver_transactional_id("job", Q).startswith(query_prefix("job", Q))


def test_leftovers_are_this_querys_only_and_this_runs_only_when_asked():
    mine = [transactional_id("job", Q, "run1", 0, p) for p in range(3)]
    older_run = [transactional_id("job", Q, "run0", 0, 0)]
    others = [transactional_id("job", OTHER, "run1", 0, 0), transactional_id("job2", Q, "run1", 0, 0), "job-unrelated", driver_transactional_id("job", Q)]
    assert leftovers(mine + older_run + others, "job", Q) == sorted(mine + older_run)
    assert leftovers(mine + older_run + others, "job", Q, run_id="run1") == sorted(mine)
    assert leftovers(mine, "job", Q, keep=mine[:1]) == sorted(mine[1:])


def test_handles_are_judged_open_only_at_the_epoch_the_task_reported():
    handed = (SinkTransaction("t0", 7, 3), SinkTransaction("t1", 8, 0), SinkTransaction("t2", 9, 0))
    states = {"t0": HandleState("Ongoing", 7, 3), "t1": HandleState("CompleteAbort", 8, 1), "t2": HandleState("Ongoing", 9, 1)}
    dead = dead_handles(handed, states)
    assert [t.transactional_id for t, _ in dead] == ["t1", "t2"]  # aborted on its timeout; fenced and reopened by someone else
    assert "CompleteAbort at producer 8 epoch 1, handed over at producer 8 epoch 0" in dead[0][1]
    assert [t.transactional_id for t, _ in dead_handles(handed[:1] + (SinkTransaction("gone", 1, 0),), states)] == ["gone"]
    text = not_open_message(4, dead, 3, 60000)
    assert "batch 4: 2 of its 3 transactions" in text and "Nothing was decided" in text
    assert "kafka.transaction.timeout.ms (60000 ms)" in text and "maxOffsetsPerTrigger" in text


def test_a_decided_batch_counts_as_all_aborted_only_when_every_transaction_is():
    decided = (SinkTransaction("t0", 7, 0), SinkTransaction("t1", 8, 0))
    aborted = {"t0": HandleState("CompleteAbort", 7, 1), "t1": HandleState("PrepareAbort", 8, 1)}
    assert all_aborted(decided, aborted)
    assert not all_aborted(decided, {**aborted, "t1": HandleState("CompleteCommit", 8, 0)})  # one committed: never re-decided
    assert not all_aborted(decided, {**aborted, "t1": HandleState("Ongoing", 8, 0)})
    assert not all_aborted(decided, {"t0": aborted["t0"]})  # an id the coordinator no longer knows: cannot tell
    assert not all_aborted((), {})


def test_the_completer_commits_what_is_open_or_being_committed_at_the_epoch_of_its_transaction_version():
    """A decided handle of epoch 4 is still to commit when Ongoing at 4, or
    PrepareCommit: at 4 with transaction version 1, at 5 with version 2
    (its EndTxn bumped the epoch; before, the completer missed it). A
    PrepareCommit at 5 under version 1 is another producer's transaction."""
    handle = SinkTransaction("t0", 7, 4, ("out-0",), 1)
    cases = [
        (HandleState("Ongoing", 7, 4), False, True),
        (HandleState("Ongoing", 7, 4), True, True),
        (HandleState("PrepareCommit", 7, 4), False, True),
        (HandleState("PrepareCommit", 7, 5), True, True),
        (HandleState("PrepareCommit", 7, 5), False, False),
        (HandleState("PrepareCommit", 7, 4), True, False),
        (HandleState("Ongoing", 7, 5), True, False),  # a later transaction
        (HandleState("PrepareCommit", 8, 5), True, False),  # another producer id
        (HandleState("CompleteCommit", 7, 5), True, False),  # done already
        (HandleState("PrepareAbort", 7, 5), True, False),
        (HandleState("Unknown"), True, False),
    ]
    for state, transaction_v2, pending in cases:
        assert still_to_commit((handle,), {"t0": state}, transaction_v2) == ((handle,) if pending else ()), (state, transaction_v2)


def test_decision_record_round_trip_and_format_check():
    decision = Decision(Q, 12, "run", OLD, {"in-0": 40})
    again = Decision.from_bytes(decision.to_bytes())
    assert again == decision and again.offsets == {"in-0": 40}
    assert pickle.loads(pickle.dumps(decision)) == decision
    with pytest.raises(SinkError, match="unknown format 9"):
        Decision.from_bytes(b'{"format": 9}')


def test_lost_message_names_what_was_lost():
    text = lost_message(7, list(OLD), 1, 3, "p-old-0: fenced")
    assert "batch 7" in text and "2 of its 3 transactions" in text and "1 committed" in text
    assert "5 records" in text and "out-0, out-1" in text and "p-old-0, p-old-1" in text
    assert "kafka.transaction.timeout.ms" in text
