"""The README's main job runs and its check can fail."""

import subprocess
import sys

from tests.conftest import REPO


def test_demo_survives_kills_and_reports(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "broker.cli", "demo", "--records", "4000", "--seed", "3", "--keep-data", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "duplicates           0" in result.stdout
    assert "lost                 0" in result.stdout
    assert "writer kills         4 (SIGKILL)" in result.stdout
    assert (tmp_path / "payments-0").is_dir()


def test_demo_check_fails_when_acknowledged_data_is_lost(tmp_path, monkeypatch):
    """Break recovery on purpose (it drops the whole log): the demo must say FAILED."""
    import broker.demo as demo

    real_read_all = demo._read_all
    calls = []

    def lossy_read_all(directory):
        sequences, report = real_read_all(directory)
        calls.append(1)
        return (sequences[: len(sequences) // 2] if len(calls) == 2 else sequences), report

    monkeypatch.setattr(demo, "_read_all", lossy_read_all)
    status = demo.run_demo(records=2000, seed=5, keep_data=str(tmp_path), kills=2)
    assert status == 1
