"""``onceflow bench --spark``'s stall scenario (``benchmarks.bench_spark``)
does what it measures: its first query SIGKILLs itself right after a
decision (its crash point hook is installed), and the completer, run the
moment the driver is seen dead, makes the decided batch visible before the
restarted query commits anything."""

import pytest

from faults.process import BrokerProcess


@pytest.mark.slow
def test_the_stall_scenario_kills_its_query_at_a_decision_and_the_completer_finishes_it(tmp_path):
    from benchmarks.bench_spark import stall_scenario

    broker = BrokerProcess(str(tmp_path / "data")).start()
    try:
        figures = stall_scenario(broker.bootstrap, kill_at=2, completer=True, first_query_timeout=300)
    finally:
        broker.terminate()
    assert figures["kill_to_visible_s"] > 0 and figures["stall_s"] >= figures["kill_to_visible_s"]
    # The decided batch became visible through the completer, not through the
    # restarted query (which needs a JVM start): no later than the completer's return.
    assert figures["kill_to_visible_s"] <= figures["completer_s"] + 1.0, figures
