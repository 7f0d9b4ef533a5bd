"""The exactly-once sink in real Spark queries killed at its crash points.

Each query runs in its own process (spark_sink_driver.py: a JVM driver in
local mode and its Python workers) reading topic ``input`` through the
onceflow source and writing ``output`` through the sink. A run is SIGKILLed
as a process group at a named crash point and restarted from its
checkpoint, sometimes with another number of partitions; a read_committed
reader runs throughout. After the last restart: every input record is in
the output exactly once, the reader never saw a record the final read does
not have at the same offset (nothing uncommitted or aborted), and no
transaction of the query is left open.

Two chains of runs, each on a checkpoint of its own, cover the matrix: each
restart first recovers from the previous crash, then reaches its own crash
point. One run has its commit raise after the decision instead: Spark then
calls the sink's abort, which must finish the batch, not undo it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from sink_crash_harness import Driver, Reader, assert_exactly_once, final_read, open_transactions, produce_input

from faults.process import REPO

pytestmark = pytest.mark.slow

@pytest.fixture
def broker(broker_process):
    return broker_process("transaction.abort.timed.out.transaction.cleanup.interval.ms=500")


def run_chain(broker, tmp_path, prefix: str, chain: list[tuple[str, int]]) -> tuple[Driver, dict]:
    """Runs the query once per (crash point, partitions) of ``chain`` on one
    checkpoint, a read_committed reader throughout: each run recovers from
    the previous one's crash, then reaches its own. What each run must do
    follows from its action: ``kill``, die by SIGKILL; ``raise`` (commit()
    raises after deciding), fail the query, Spark calling abort(), which must
    finish the decided batch instead of undoing it; ``exit`` (a task's Python
    worker dies mid-write, its transaction open), have the task retried and
    finish; none, finish. The last run must finish. Then: every input once
    in the output, nothing the reader saw that the final read lacks, no
    transaction of the query left open. Returns the driver and the output."""
    inputs = produce_input(broker.bootstrap, 200)
    reader = Reader(broker.bootstrap)
    reader.start()
    driver = Driver(broker.bootstrap, tmp_path)
    checkpoint = str(tmp_path / "ckpt")
    for crash, partitions in chain:
        code, log, fired = driver.run(checkpoint, prefix, partitions, crash)
        assert fired == crash, f"run with {crash} ended {code} without reaching it:\n{log[-3000:]}"
        action = crash.rpartition(":")[2]
        if action == "kill":
            assert code == -signal.SIGKILL, log[-3000:]
        elif action == "raise":
            assert code == 1 and "CrashPointReached" in log, log[-3000:]
            assert open_transactions(broker.bootstrap, prefix) == [], "abort() left the decided batch open"
        else:
            assert code == 0 and "DONE" in log, log[-3000:]
    assert code == 0, f"the last run of the chain must finish the query:\n{log[-3000:]}"
    reader.stopping.set()
    reader.join(30)
    assert reader.error is None, reader.error
    final = assert_exactly_once(broker.bootstrap, reader, inputs)
    assert open_transactions(broker.bootstrap, prefix) == []
    assert reader.seen, "the reader ran throughout but saw nothing"
    return driver, final


# Two chains, so that two Spark lanes run them side by side (tests/conftest.py):
# every crash point of the sink is reached in one of them, each run with
# another number of partitions than the run it recovers from.


def test_driver_killed_before_at_and_after_its_decision_then_restarted(broker, tmp_path):
    run_chain(broker, tmp_path, "crashjob", [
        ("spark_sink.before_decision@2:kill", 2),
        ("spark_sink.after_decision@2:kill", 3),
        ("spark_sink.after_all_commits@2:kill", 1),
        ("", 2),
    ])


def test_driver_killed_amid_its_commits_then_a_failed_commit_and_a_dead_task(broker, tmp_path):
    prefix = "crashjob"
    driver, final = run_chain(broker, tmp_path, prefix, [
        ("spark_sink.after_commit@4:kill", 3),  # k of n: a later batch's first commits
        ("spark_sink.after_decision@1:raise", 2),
        ("spark_sink.task_before_handle@3:exit", 1),
    ])
    # A second query (a new checkpoint) on the same prefix is refused before it commits anything.
    code, log, _ = driver.run(str(tmp_path / "other-ckpt"), prefix, 2)
    assert code == 1 and "is in use by query" in log and "its own transactionalIdPrefix" in log, log[-3000:]
    assert final_read(broker.bootstrap) == final
    assert open_transactions(broker.bootstrap, prefix) == []


@pytest.mark.parametrize("crash, committed_before", [("spark_sink.after_decision@1:kill", 0), ("spark_sink.after_commit@1:kill", 1)])
def test_decided_transactions_timed_out_before_the_restart(broker, tmp_path, crash, committed_before):
    """The driver is killed after deciding batch 0 (none or one of its two
    transactions committed), and the broker aborts the open ones on their
    timeout before the restart. None committed: every decided transaction is
    verified aborted, the re-run recomputed the whole batch, so the restart
    decides the re-run's and the query goes on (issue 27, item 2: it used to
    stay wedged). One committed: the loud failure, naming what was lost."""
    inputs = produce_input(broker.bootstrap, 20)
    driver = Driver(broker.bootstrap, tmp_path)
    checkpoint, prefix, timeout = str(tmp_path / "ckpt"), "slowjob", ("kafka.transaction.timeout.ms=15000",)  # longer than a batch takes on a loaded machine, or the driver rightly refuses to decide
    code, log, fired = driver.run(checkpoint, prefix, 2, crash, timeout)
    assert fired and code == -signal.SIGKILL, log[-3000:]
    # (not checked that they are still open here: on a loaded machine the timeout may already have aborted them)
    deadline = time.monotonic() + 60
    while open_transactions(broker.bootstrap, prefix):  # the broker aborts them when they time out
        assert time.monotonic() < deadline
        time.sleep(0.5)
    code, log, _ = driver.run(checkpoint, prefix, 2, "", timeout)
    if committed_before == 0:
        assert code == 0, log[-3000:]
        assert sorted(final_read(broker.bootstrap).values()) == sorted(inputs)
    else:
        assert code == 1, log[-3000:]
        assert "batch 0 was decided but 1 of its 2 transactions can no longer be committed (1 committed)" in log, log[-3000:]
        assert 0 < len(final_read(broker.bootstrap)) < len(inputs)  # the committed half only, and the re-run's transactions are aborted
    assert open_transactions(broker.bootstrap, prefix) == []


def test_the_completer_finishes_a_killed_drivers_decided_batch_before_spark_restarts(broker, tmp_path):
    """Issue 30: the driver is SIGKILLed with batch 0 decided and nothing
    committed; `onceflow spark finish-decided` (no Spark) commits it, so the
    output is whole before any restart; the restarted query then writes
    nothing twice."""
    inputs = produce_input(broker.bootstrap, 20)
    driver = Driver(broker.bootstrap, tmp_path)
    checkpoint, prefix = str(tmp_path / "ckpt"), "finishing"
    code, log, fired = driver.run(checkpoint, prefix, 2, "spark_sink.after_decision@1:kill")
    assert fired and code == -signal.SIGKILL, log[-3000:]
    assert open_transactions(broker.bootstrap, prefix), "the decided transactions should be open after the kill"
    finish = subprocess.run(
        [sys.executable, "-m", "onceflow", "spark", "finish-decided", "--bootstrap-server", broker.bootstrap, "--prefix", prefix],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert finish.returncode == 0 and "batch 0 of query" in finish.stdout and "2 of 2 decided transactions committed now" in finish.stdout, finish.stdout + finish.stderr
    assert open_transactions(broker.bootstrap, prefix) == []
    assert sorted(final_read(broker.bootstrap).values()) == sorted(inputs)  # before Spark restarts
    code, log, _ = driver.run(checkpoint, prefix, 2)
    assert code == 0, log[-3000:]
    assert sorted(final_read(broker.bootstrap).values()) == sorted(inputs)
    assert open_transactions(broker.bootstrap, prefix) == []
