"""The README's main job runs and its check can fail."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_demo_survives_kills_and_reports(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "onceflow", "demo", "--storage", "--records", "4000", "--seed", "3", "--keep-data", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "duplicates           0" in result.stdout
    assert "lost                 0" in result.stdout
    assert "writer kills         4 (SIGKILL)" in result.stdout
    assert (tmp_path / "payments-0").is_dir()


def test_demo_check_fails_when_acknowledged_data_is_lost(tmp_path, monkeypatch):
    """Break recovery on purpose (it drops the whole log): the demo must say FAILED."""
    import faults.storage_demo as demo

    real_read_all = demo._read_all
    calls = []

    def lossy_read_all(directory):
        sequences, report = real_read_all(directory)
        calls.append(1)
        return (sequences[: len(sequences) // 2] if len(calls) == 2 else sequences), report

    monkeypatch.setattr(demo, "_read_all", lossy_read_all)
    status = demo.run_demo(records=2000, seed=5, keep_data=str(tmp_path), kills=2)
    assert status == 1


def test_seeds_replay_the_same_payments_and_kills():
    import random

    import faults.demo as demo

    assert demo.payments(500, random.Random(9)) == demo.payments(500, random.Random(9))
    assert demo.payments(500, random.Random(9)) != demo.payments(500, random.Random(10))
    plans = {seed: demo.plan_faults(6, True, random.Random(seed)) for seed in range(20)}
    assert plans == {seed: demo.plan_faults(6, True, random.Random(seed)) for seed in range(20)}
    for plan in plans.values():
        assert len(plan) == 6 and {"pipeline", "broker", "spark"} <= set(plan), plan
    assert len({tuple(plan) for plan in plans.values()}) > 1, "the seed chooses the order of the kills"
    assert demo.plan_faults(2, True, random.Random(1)).count("spark") <= 1
    assert "spark" not in demo.plan_faults(6, False, random.Random(1))


def test_demo_without_java_says_so_in_one_line(tmp_path):
    """No java on PATH and no JAVA_HOME: one line naming Java and --no-spark, no stack trace, exit 2."""
    environment = {key: value for key, value in os.environ.items() if key not in ("JAVA_HOME", "PATH")}
    environment["PATH"] = str(tmp_path)  # an empty directory: no java, no anything
    result = subprocess.run([sys.executable, "-m", "onceflow", "demo", "--records", "100"], cwd=REPO, env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Java" in lines[0] and "--no-spark" in lines[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout and "Exception" not in result.stderr
    environment["JAVA_HOME"] = str(tmp_path)
    result = subprocess.run([sys.executable, "-m", "onceflow", "demo"], cwd=REPO, env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "JAVA_HOME" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.slow
def test_demo_fails_when_the_spark_totals_are_wrong(tmp_path, monkeypatch):
    """Expect one Spark row with a different total than the query computes:
    the check must fail, naming the row as lost and wrong."""
    import io

    import faults.demo as demo

    real = demo.spark_rows_expected

    def tampered(balances):
        rows = real(balances)
        if rows:
            key = min(rows)
            rows[key] = {**rows[key], "balance_total": rows[key]["balance_total"] + 1}
        return rows

    monkeypatch.setattr(demo, "spark_rows_expected", tampered)
    out = io.StringIO()
    assert demo.run_demo(records=3000, seed=2, faults=0, report_dir=str(tmp_path / "report"), out=out) == 1
    text = out.getvalue()
    assert "FAILED" in text and re.search(r"wrong totals\s+1\n", text), text[-3000:]
    assert "copy-unexpected" in text and "copy-missing" in text
    assert re.search(r"wrong balances\s+0\n", text), "only the Spark side was tampered with"


@pytest.mark.slow
def test_pipeline_demo_is_exactly_once_through_kills(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "onceflow", "demo", "--no-spark", "--records", "3000", "--seed", "5", "--faults", "4", "--keep-data", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=400,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    report = result.stdout
    assert "verdict                     OK: exactly once" in report
    assert "balances out (committed)    3000" in report and re.search(r"duplicates\s+0\n", report) and re.search(r"lost\s+0\n", report)
    assert re.search(r"faults injected\s+4 ", report)
    committed = re.search(r"transactions\s+(\d+) committed, (\d+) aborted", report)
    assert committed and int(committed.group(1)) > 0, report
    assert os.path.isdir(os.path.join(tmp_path, "data", "balances-0")), "the data is kept for inspection"
    # The pipeline's availability: each kill's recovery measured (faults.availability).
    assert re.search(r"pipeline availability: \d+ of 4 faults hit while records were in flight", report), report
    availability = json.loads(open(os.path.join(tmp_path, "report", "verdict.json")).read())["availability"]
    assert len(availability["per_fault"]) == 4 and availability["longest_stall"] is not None


@pytest.mark.slow
def test_pipeline_demo_fails_when_the_output_is_wrong(tmp_path, monkeypatch):
    """Expect different balances than the pipeline computes: the check must fail."""
    import io

    import faults.demo as demo

    real = demo.expected_outputs

    def off_by_one(events):
        expected = real(events)
        first = next(iter(expected))
        expected[first] = expected[first] + "1"
        return expected

    monkeypatch.setattr(demo, "expected_outputs", off_by_one)
    out = io.StringIO()
    assert demo.run_pipeline_demo(records=500, seed=2, faults=1, out=out) == 1
    assert "FAILED" in out.getvalue() and "copy-unexpected" in out.getvalue()
