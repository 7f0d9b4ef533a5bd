"""The SASL_SSL-beside-PLAINTEXT benchmark's harness with tiny sizes (this
checks that it measures both listeners, not speed)."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_sasl_ssl_scenario_measures_both_listeners(tmp_path):
    from benchmarks import bench_sasl
    from benchmarks.suite import SECURITY_SCENARIOS

    assert "SASL_SSL beside PLAINTEXT" in [scenario.name for scenario in SECURITY_SCENARIOS]
    result = bench_sasl.measure(2000, rounds=1, work_dir=str(tmp_path))
    for kind in ("produce", "consume"):
        assert result[kind]["PLAINTEXT"] > 0 and result[kind]["SASL_SSL"] > 0
        assert result[kind]["ratio"] == pytest.approx(result[kind]["SASL_SSL"] / result[kind]["PLAINTEXT"])
