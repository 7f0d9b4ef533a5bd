"""The chaos runner end to end: each workload under its faults comes out
valid with a full report; a broken reader is caught; a user's processor is
tested through the Python API; the same seed gives the same schedule."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import types

import pytest

from faults.chaos import FAULT_KINDS, ChaosSettings, fault_schedule, run_as_script, run_chaos
from tests.conftest import REPO


def test_the_same_seed_gives_the_same_schedule():
    copier_faults = tuple(kind for kind in FAULT_KINDS if kind not in ("kill-driver", "kill-executor", "lose-disk"))  # Spark's processes, app instances' state: only their workloads have them
    settings = ChaosSettings(workload="copier", faults=copier_faults, duration=120, seed=7)
    first = fault_schedule(settings)
    assert first == fault_schedule(ChaosSettings(workload="copier", faults=tuple(reversed(copier_faults)), duration=120, seed=7))
    assert first != fault_schedule(ChaosSettings(workload="copier", faults=copier_faults, duration=120, seed=8))
    assert {f.kind for f in first} <= set(copier_faults) and len(first) > 10
    assert all(0 < f.at < 119 for f in first)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="unknown fault"):
        ChaosSettings(workload="copier", faults=("meteor",))
    with pytest.raises(ValueError, match="processor"):
        ChaosSettings(workload="processor")
    with pytest.raises(ValueError, match="lose-disk needs the streaming workload"):
        ChaosSettings(workload="copier", faults=("lose-disk",))


def run(tmp_path, **options):
    report = str(tmp_path / "report")
    verdict = run_chaos(ChaosSettings(**options), report, out=io.StringIO())
    return verdict, report


@pytest.mark.slow
def test_copier_under_every_process_and_network_fault(tmp_path):
    verdict, report = run(tmp_path, workload="copier", faults=("kill-broker", "kill-client", "proxy-cut", "torn-tail", "pause-client", "proxy-delay-endtxn"),
                          duration=16, seed=5, records=3000, mean_fault_interval=2.5, abort_ratio=0.3)
    assert verdict.valid, verdict.summary()
    # 3,000 inputs and their copies, read back: the input now arrives at a
    # steady rate over the run, and on a loaded machine the last few may miss
    # the end (a CI run read 5,978; the verdict checks every one that arrived).
    assert verdict.counts["read"] >= 5400 and verdict.counts["aborted"] > 0
    for name in ("history.jsonl", "faults.jsonl", "verdict.json", "summary.txt", "timeline.png"):
        assert os.path.getsize(os.path.join(report, name)) > 0, name
    faults = [json.loads(line) for line in open(os.path.join(report, "faults.jsonl"))]
    assert len(faults) >= 3
    with open(os.path.join(report, "timeline.png"), "rb") as file:
        assert file.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "VALID" in open(os.path.join(report, "summary.txt")).read()
    # The input arrived over the whole run: every fault hit records in flight,
    # and each one's recovery is measured (faults.availability).
    availability = json.load(open(os.path.join(report, "verdict.json")))["availability"]
    assert availability["faults_idle"] == 0 and availability["faults_in_flight"] == len(faults)
    assert len(availability["per_fault"]) == len(faults)
    assert all(fault["first_output_s"] is not None for fault in availability["per_fault"]), availability["per_fault"]
    assert "faults hit while records were in flight" in open(os.path.join(report, "summary.txt")).read()


@pytest.mark.slow
def test_copier_with_durability_at_the_end_of_its_transactions_under_broker_kills(tmp_path):
    """``transaction.durable.at.end``: the copier's Produce and
    TxnOffsetCommit are answered before their fsync, and the broker is
    killed (an unclean stop in the same boot: its open transactions stay
    open, the page cache holding every byte; torn tails beside, whose
    unanswered half batch recovery cuts). Still exactly once. (A start in a
    new boot aborts them instead: the power-cut tests show that.)"""
    verdict, report = run(tmp_path, workload="copier", faults=("kill-broker", "torn-tail"), duration=16, seed=5, records=3000,
                          mean_fault_interval=2.5, abort_ratio=0.1, broker_config=("transaction.durable.at.end=true",))
    assert verdict.valid, verdict.summary()
    assert verdict.counts["read"] >= 5400, verdict.counts
    faults = [json.loads(line) for line in open(os.path.join(report, "faults.jsonl"))]
    assert sum(fault.get("kind") == "kill-broker" for fault in faults) >= 2, faults


@pytest.mark.slow
def test_a_fault_on_a_finished_workload_is_reported(tmp_path):
    """The harness checks that the workload outlives its faults: one record
    of input is copied at once, so the faults after it hit an idle copier (16 s:
    on a loaded machine the copier can take 8 s to start and copy it, and
    every fault before that finds the record still waiting)."""
    verdict, report = run(tmp_path, workload="copier", faults=("kill-client",), duration=16, seed=1, records=1, mean_fault_interval=3)
    assert verdict.anomaly_counts.get("idle-fault", 0) >= 1, verdict.summary()
    assert set(verdict.anomaly_counts) == {"idle-fault"}, verdict.summary()  # exactly once still held
    assert json.load(open(os.path.join(report, "verdict.json")))["availability"]["faults_idle"] >= 1


@pytest.mark.slow
def test_idempotent_producer_under_cuts_pauses_and_a_failing_disk(tmp_path):
    verdict, _report = run(tmp_path, workload="producer", faults=("proxy-cut", "pause-client", "disk-fsync", "kill-broker"),
                           duration=12, seed=3, records=3000, mean_fault_interval=2.5)
    assert verdict.valid, verdict.summary()
    assert verdict.counts["committed"] == 6000 and verdict.counts["read"] == 6000


@pytest.mark.slow
def test_bank_total_is_conserved(tmp_path):
    verdict, _report = run(tmp_path, workload="bank", faults=("kill-client", "kill-broker", "proxy-delay-endtxn"), duration=12, seed=2, mean_fault_interval=3)
    assert verdict.valid, verdict.summary()
    assert verdict.counts["audits"] > 0 and verdict.counts["committed"] > 20


@pytest.mark.slow
def test_a_reader_that_ignores_aborts_is_caught(tmp_path):
    verdict, report = run(tmp_path, workload="copier", faults=(), duration=5, seed=1, records=1000, abort_ratio=0.5, reader_isolation="read_uncommitted")
    assert not verdict.valid
    assert verdict.anomaly_counts.get("aborted-read", 0) > 0 and verdict.anomaly_counts.get("copy-duplicate", 0) > 0
    assert "INVALID" in open(os.path.join(report, "summary.txt")).read()


def test_a_users_chaos_test_run_as_a_script_exits_with_its_verdict(tmp_path):
    folders = []

    def checking(valid: bool):
        def check(folder: str):
            folders.append(folder)
            return types.SimpleNamespace(valid=valid)

        return check

    assert run_as_script(checking(True), "mine-", [str(tmp_path)]) == 0 and folders == [str(tmp_path)]
    assert run_as_script(checking(False), "mine-", []) == 1
    made = folders[1]
    assert os.path.basename(made).startswith("mine-") and os.path.isdir(made)
    shutil.rmtree(made)


@pytest.mark.slow
def test_users_processor_example(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "examples"))
    try:
        import chaos_test_of_my_processor as example
    finally:
        sys.path.pop(0)
    verdict = example.check_my_processor(str(tmp_path / "report"), duration=12)
    assert verdict.valid, verdict.summary()


@pytest.mark.slow
def test_command_line_runs_a_schedule_and_writes_the_report(tmp_path):
    report = tmp_path / "cli-report"
    result = subprocess.run(
        [sys.executable, "-m", "onceflow", "chaos", "--workload", "copier", "--faults", "kill-client,proxy-cut", "--duration", "8",
         "--seed", "4", "--records", "1000", "--report", str(report)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "VALID" in result.stdout and "faults healed" in result.stdout
    assert json.loads((report / "verdict.json").read_text())["valid"] is True


def test_a_fault_due_while_the_input_idles_between_phases_waits_for_the_next_phase(tmp_path):
    """A fault between two input phases, with everything fed processed, would
    hit a workload with nothing to do (an idle fault proves nothing): it waits
    until a record of the next phase is acknowledged; a fault due while the
    app still works through what was fed goes ahead."""
    from faults.chaos import ChaosRun, PlannedFault

    run = ChaosRun(ChaosSettings(workload="copier", faults=("kill-broker",)), str(tmp_path / "report"), out=io.StringIO())
    processed = []
    run._fed_input_processed = lambda: bool(processed)
    run.feeding_input, run.phases, run.feeding, run.in_flight, run.fed = True, [["next phase"]], [], [], ["a", "b"]
    run.next_idle_check, run.idle_until_fed_beyond = 0.0, None
    kill = PlannedFault(at=1.0, kind="kill-broker", victim=0)
    assert not run._fault_waits(kill), "the app has not processed what was fed: input is in flight"
    run.next_idle_check = 0.0
    processed.append(True)
    assert run._fault_waits(kill), "everything fed is processed and the next phase is not fed yet"
    run.feeding = ["c"]  # the next phase is being sent, nothing of it acknowledged yet
    assert run._fault_waits(kill)
    run.fed.append("c")
    assert not run._fault_waits(kill), "a record of the next phase is acknowledged"
    run.feeding, run.phases, run.next_idle_check = [], [], 0.0
    assert not run._fault_waits(kill), "after the last phase nothing is held back (a fault then is reported idle)"
