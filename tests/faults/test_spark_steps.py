"""Where a Spark driver kill lands in the sink's two-phase commit: the step
log the sink's crash point hook writes under the harness (``faults.spark``),
its hold after a decision, and the demo's report lines on the kills."""

import os
import subprocess
import sys
import time

import pytest

from faults.demo import SparkKill, spark_kill_lines
from faults.spark import (
    AFTER_ALL_COMMITS,
    AFTER_COMMIT,
    AFTER_DECISION,
    BEFORE_DECISION,
    STEPS_VARIABLE,
    TASK_WRITING,
    decided_and_open,
    describe_step,
    read_steps,
)
from streaming.spark import crashpoints
from tests.conftest import REPO
from tests.helpers import wait_for


def test_the_step_names_are_the_sinks_crash_points():
    assert (TASK_WRITING, BEFORE_DECISION, AFTER_DECISION, AFTER_COMMIT, AFTER_ALL_COMMITS) == crashpoints.CRASH_POINTS


@pytest.mark.parametrize(
    ("steps", "described", "decided"),
    [
        ([], "before the sink's first batch", False),
        ([TASK_WRITING, TASK_WRITING], "tasks writing (transactions open, undecided)", False),
        ([TASK_WRITING, BEFORE_DECISION], "written, not yet decided (transactions open, undecided)", False),
        ([TASK_WRITING, BEFORE_DECISION, AFTER_DECISION], "decided, none of its transactions committed yet", True),
        ([BEFORE_DECISION, AFTER_DECISION, AFTER_COMMIT, AFTER_COMMIT, AFTER_ALL_COMMITS, BEFORE_DECISION, AFTER_DECISION, AFTER_COMMIT],
         "decided, 1 of its transactions committed (the rest open)", True),
        ([BEFORE_DECISION, AFTER_DECISION, AFTER_COMMIT, AFTER_ALL_COMMITS], "between batches (the last one wholly committed)", False),
    ],
)
def test_a_kill_is_described_by_the_last_step_the_sink_passed(steps, described, decided):
    assert describe_step(steps) == described
    assert decided_and_open(steps) is decided


def hook_process(steps_path: str, name: str) -> subprocess.Popen:
    code = f"from faults.spark import sink_step; sink_step({name!r}); print('passed', flush=True)"
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, **{STEPS_VARIABLE: steps_path}, PYTHONPATH=REPO),
                            stdout=subprocess.PIPE, text=True)


def test_the_hook_notes_steps_and_holds_after_a_decision_only_when_asked(tmp_path):
    """The hook runs in another process (as in Spark's Python workers): it
    appends each step with its time; asked to hold, it stops right after the
    next decision until the request's file is removed (or renamed back, which
    asks for the next decision instead)."""
    steps_path = str(tmp_path / "steps.log")
    started = time.time()
    for name in (BEFORE_DECISION, AFTER_DECISION):
        assert hook_process(steps_path, name).wait(60) == 0  # not asked: no hold
    assert read_steps(steps_path, started) == [BEFORE_DECISION, AFTER_DECISION]
    assert read_steps(steps_path, time.time() + 1) == [], "steps of an earlier start are not this start's"

    request, holding = steps_path + ".hold-request", steps_path + ".holding"
    open(request, "w").close()
    assert hook_process(steps_path, AFTER_COMMIT).wait(60) == 0, "only a decision holds"
    assert os.path.exists(request)
    held = hook_process(steps_path, AFTER_DECISION)
    wait_for(lambda: os.path.exists(holding), 20, "the hook to hold", interval=0.02)
    assert not os.path.exists(request), "one decision claims one request"
    time.sleep(0.3)
    assert held.poll() is None, "held while the holding file is there"
    assert read_steps(steps_path)[-1] == AFTER_DECISION, "the step is noted before the hold"
    os.rename(holding, request)  # let it go, hold the next one
    assert held.wait(20) == 0 and held.stdout.read() == "passed\n"
    second = hook_process(steps_path, AFTER_DECISION)
    wait_for(lambda: os.path.exists(holding), 20, "the hook to hold", interval=0.02)
    second.kill()  # what the demo does: SIGKILL while held
    assert second.wait(20) != 0


def test_the_report_names_each_spark_kills_step_and_what_the_completer_did():
    kills = [
        SparkKill(31.25, 4, describe_step([BEFORE_DECISION, AFTER_DECISION]), True, "committed 2 of batch 4's 2 decided transactions", 0.42),
        SparkKill(80.0, 9, describe_step([TASK_WRITING]), False, "committed 0 of batch 8's 2 decided transactions", 0.2),
    ]
    samples = [(10.0, 4), (31.0, 8), (31.9, 12), (120.5, 16)]
    lines = spark_kill_lines(kills, samples)
    assert lines[0] == "  Spark driver kills          2 (1 with a batch decided and not wholly committed)"
    assert lines[1] == ("    t= 31.2s  batch 4: decided, none of its transactions committed yet; completer: committed 2 of batch 4's 2 decided transactions"
                        " in 0.4 s; Spark rows visible again 0.6 s after the kill")
    assert lines[2].startswith("    t= 80.0s  batch 9: tasks writing (transactions open, undecided); completer: committed 0 of batch 8's")
    assert lines[2].endswith("visible again 40.5 s after the kill")
    assert spark_kill_lines([], samples) == []
    alone = spark_kill_lines(kills[:1], [(10.0, 4)])
    assert alone[1].endswith("in 0.4 s"), "no rows after the kill: nothing claimed"


def test_the_demo_timeline_marks_spark_batches_and_kills(tmp_path):
    """The timeline draws the moments (Spark's committed batches, the
    driver kills) along the Spark panel, and a run without them still draws."""
    from faults.availability import FaultEvent
    from faults.report import write_series_png

    series = {"payments in": [(1.0, 100), (2.0, 300)], "balances out": [(1.5, 90), (2.5, 300)], "Spark rows out": [(2.2, 4), (3.1, 8)]}
    faults = [FaultEvent(2.0, "kill-spark-driver", "batch 1: decided", cleared=2.5, victim="spark")]
    marked, plain = tmp_path / "marked.png", tmp_path / "plain.png"
    moments = {"Spark batch committed": [1.2, 2.1, 3.0], "Spark driver killed (completer ran)": [2.0]}
    assert write_series_png(str(marked), series, faults, 4.0, "t", None, moments) is None
    assert write_series_png(str(plain), series, faults, 4.0, "t") is None
    assert marked.read_bytes() != plain.read_bytes(), "the moments are drawn"
