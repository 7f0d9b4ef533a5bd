"""onceflow chaos --workload spark: a user's Spark query (a module that
builds it, faults.spark's convention) under driver kills, broker kills and
connection cuts, checked against the module's expected output; and the
check failing when the expectation is wrong."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from faults.chaos import ChaosSettings, fault_schedule, run_chaos
from faults.spark import STARTED_LINE
from tests.conftest import REPO

EXAMPLES = os.path.join(REPO, "examples")


def test_kill_driver_is_on_the_menu_of_the_spark_workload_only():
    settings = ChaosSettings(workload="spark", query="examples/spark_region_totals.py", faults=("kill-driver", "kill-broker"), duration=60, seed=1, mean_fault_interval=20)
    assert "kill-driver" in {fault.kind for fault in fault_schedule(settings)}
    with pytest.raises(ValueError, match="kill-driver needs the spark workload"):
        ChaosSettings(workload="copier", faults=("kill-driver",))
    with pytest.raises(ValueError, match="needs a query module"):
        ChaosSettings(workload="spark")
    with pytest.raises(ValueError, match="only it takes one"):
        ChaosSettings(workload="copier", query="examples/spark_region_totals.py")

    settings = ChaosSettings(workload="spark", query="examples/spark_region_totals.py", faults=("kill-executor",), duration=60, seed=1, mean_fault_interval=20)
    assert {fault.kind for fault in fault_schedule(settings)} == {"kill-executor"}
    with pytest.raises(ValueError, match="kill-executor needs the spark workload"):
        ChaosSettings(workload="streaming", app="examples/payments_pipeline.py", faults=("kill-executor",))


def test_command_line_refuses_the_spark_workload_without_a_query(tmp_path):
    result = subprocess.run([sys.executable, "-m", "onceflow", "chaos", "--workload", "spark", "--report", str(tmp_path / "r")],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--query" in result.stderr, result.stderr


def test_the_example_query_module_follows_the_convention():
    from faults.spark import load_query_module

    module = load_query_module(os.path.join(EXAMPLES, "spark_region_totals.py"))
    phases = module.chaos_input(3000, 1)
    assert [len(phase) for phase in phases] == [3000, 1], "the closing record goes in a phase of its own"
    rows = module.expected(phases[0] + phases[1])
    assert len(rows) == 8  # 3000 records 30 ms apart span 90 s: two minutes, four regions
    assert sum(row["payments"] for _key, row in rows) == 3000


@pytest.mark.slow
def test_users_spark_query_example_under_driver_and_broker_kills(tmp_path):
    sys.path.insert(0, EXAMPLES)
    try:
        import chaos_test_of_my_spark_query as example
    finally:
        sys.path.pop(0)
    verdict = example.check_my_query(str(tmp_path / "report"))
    driver_log = tmp_path / "report" / "spark-driver.log"  # kept in the report when the verdict is invalid
    assert verdict.valid, verdict.summary() + ("\nthe driver's log ends:\n" + driver_log.read_text(errors="replace")[-6000:] if driver_log.exists() else "")
    summary = (tmp_path / "report" / "summary.txt").read_text()
    assert "kill-driver x1" in summary, summary
    assert (tmp_path / "report" / "timeline.png").exists()


@pytest.mark.slow
def test_a_wrong_expectation_of_the_spark_output_is_caught(tmp_path):
    """The query's real output against an expectation with one total off by
    one: the checker must report that row missing and the real one unexpected."""
    module = tmp_path / "off_by_one_query.py"
    module.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {EXAMPLES!r})
        from spark_region_totals import CHAOS_OUTPUT, CHAOS_TOPICS, build, chaos_input
        from spark_region_totals import expected as right

        def expected(records):
            rows = sorted(right(records))
            key, row = rows[0]
            return [(key, dict(row, payments=row["payments"] + 1))] + rows[1:]
    """))
    verdict = run_chaos(ChaosSettings(workload="spark", query=str(module), faults=(), duration=5, seed=3, records=1000), str(tmp_path / "report"))
    assert not verdict.valid
    assert verdict.anomaly_counts == {"copy-missing": 1, "copy-unexpected": 1}, verdict.summary()
    assert STARTED_LINE in (tmp_path / "report" / "spark-driver.log").read_bytes()  # an invalid report keeps the driver's log


def test_command_line_says_in_one_line_that_java_is_missing(tmp_path):
    environment = {key: value for key, value in os.environ.items() if key not in ("JAVA_HOME", "PATH")}
    environment["PATH"] = str(tmp_path)
    result = subprocess.run([sys.executable, "-m", "onceflow", "chaos", "--workload", "spark", "--query", "examples/spark_region_totals.py",
                             "--faults", "kill-driver", "--report", str(tmp_path / "r")], cwd=REPO, env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Java" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_executor_kills_on_a_cluster_started_for_the_run_lose_and_duplicate_nothing(tmp_path):
    """kill-executor: the query runs on a standalone cluster the run starts
    (two workers); one worker's executor JVM, Python daemon and workers are
    SIGKILLed while the query works; Spark reruns the lost tasks on a new
    executor and the output is still exactly the expected rows. The cluster
    is gone afterwards."""
    from streaming.spark.cluster import processes_of

    report = tmp_path / "report"
    result = subprocess.run([sys.executable, "-m", "onceflow", "chaos", "--workload", "spark", "--query", "examples/spark_region_totals.py",
                             "--faults", "kill-executor", "--duration", "40", "--mean-fault-interval", "15", "--records", "1500", "--seed", "4",
                             "--report", str(report)], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    assert "starting a Spark standalone cluster" in result.stdout
    killed = [line for line in result.stdout.splitlines() if "kill-executor:" in line and "executor killed" in line]
    assert killed, "at least one executor was running and was killed: " + result.stdout[-3000:]
    summary = (report / "summary.txt").read_text()
    assert "kill-executor x" in summary and "VALID: no anomaly found" in summary, summary
    directory = re.search(r"cluster up: spark://\S+ in (\S+),", result.stdout)
    assert directory and not processes_of(directory.group(1)), "the run's cluster was stopped"
