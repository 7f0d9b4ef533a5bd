"""The README's main job runs and its check can fail."""

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


@pytest.mark.slow
def test_pipeline_demo_is_exactly_once_through_kills(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "onceflow", "demo", "--records", "3000", "--seed", "5", "--faults", "4", "--keep-data", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=400,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    report = result.stdout
    assert "verdict                     OK: exactly once" in report
    assert "balances out (committed)    3000" in report and "duplicates                  0" in report
    assert re.search(r"faults injected\s+4 ", report)
    committed = re.search(r"transactions\s+(\d+) committed, (\d+) aborted", report)
    assert committed and int(committed.group(1)) > 0, report
    assert os.path.isdir(os.path.join(tmp_path, "data", "balances-0")), "the data is kept for inspection"


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
