"""The sink's commit protocol without I/O: the decision table, the naming of
transactional ids, the decision record's format."""

from __future__ import annotations

import pickle

import pytest

from streaming.spark.decision import (
    Decision,
    PrefixInUseError,
    SinkError,
    SinkTransaction,
    leftovers,
    lost_message,
    plan_abort,
    plan_commit,
    query_prefix,
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
        (Decision(OTHER, 5, "run1", OLD), (), NEW),
    ],
)
def test_plan_abort_never_undoes_a_decision(latest, finish, abort):
    plan = plan_abort(latest, Q, 5, NEW)
    assert plan.finish == finish
    assert plan.abort == abort


def test_transactional_ids_per_query_run_partition_attempt():
    a = transactional_id("job", Q, "1b424c33-32d3-4289", 3, 0)
    assert a == "job-6f1c0d2e0000-1b424c33-3"
    assert transactional_id("job", Q, "1b424c33-32d3-4289", 3, 1) == a + "-a1"
    assert transactional_id("job", Q, "ffff0000-32d3", 3, 0) != a  # a restart never reuses a name
    assert a.startswith(query_prefix("job", Q))
    assert not transactional_id("job", OTHER, "1b424c33", 3, 0).startswith(query_prefix("job", Q))


def test_leftovers_are_this_querys_only():
    mine = [transactional_id("job", Q, "run1", p, 0) for p in range(3)]
    others = [transactional_id("job", OTHER, "run1", 0, 0), transactional_id("job2", Q, "run1", 0, 0), "job-unrelated"]
    assert leftovers(mine + others, "job", Q) == sorted(mine)
    assert leftovers(mine, "job", Q, keep=mine[:1]) == sorted(mine[1:])


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
