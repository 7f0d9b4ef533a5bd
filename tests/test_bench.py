"""`onceflow bench` runs every scenario against both brokers and writes a
table and a JSON file (tiny sizes: this checks the harness, not speed)."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.suite import SCENARIOS, fraction_of_limit, medians, tansu_available
from tests.conftest import REPO


@pytest.mark.slow
def test_bench_runs_every_scenario_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--rounds", "1", "--records", "4000", "--seconds", "0.5",
         "--copier-records", "1500", "--latency-rate", "200", "--json", str(out), "--png", str(tmp_path / "bench.png")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    scenarios = {row["scenario"] for row in report["rows"]}
    assert scenarios == {scenario.name for scenario in SCENARIOS}
    for row in report["rows"]:
        assert row["onceflow"] > 0, row
        if tansu_available():
            assert row["peer"] is not None and row["peer"] > 0, row
    assert report["limits"]["fsyncs_per_s"] > 0 and report["limits"]["loopback_mb_per_s"] > 0
    assert "Tansu does not filter aborted records" in result.stdout
    if tansu_available():
        assert os.path.getsize(tmp_path / "bench.png") > 0


def test_medians_and_limits_are_computed_from_the_rounds():
    results = {"produce 1 KiB, acks=all": {"records/s": [10.0, 30.0, 20.0], "MB/s": [1.0, 3.0, 2.0], "_unit:MB/s": "MB/s"}}
    assert medians(results) == {"produce 1 KiB, acks=all": {"records/s": 20.0, "MB/s": 2.0}}
    limits = {"disk_write_16k_mb_per_s": 300.0, "disk_write_1m_mb_per_s": 400.0, "loopback_mb_per_s": 1000.0, "fsyncs_per_s": 100.0}
    produce = next(s for s in SCENARIOS if s.name == "produce 1 KiB, acks=all")
    assert fraction_of_limit(produce, {"records/s": 20.0, "MB/s": 200.0}, limits).startswith("0.500 of 400 MB/s")
    commits = next(s for s in SCENARIOS if s.name == "transactions of 1 record")
    assert fraction_of_limit(commits, {"transactions/s": 25.0}, limits).startswith("0.250 of 100 fsyncs/s")
