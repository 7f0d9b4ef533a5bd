"""The runner benchmark's table (the whole run is `onceflow bench --runner`)."""

from benchmarks.runner_bench import table


def test_ratios_favour_onceflow_above_one_and_latencies_are_inverted():
    lines: list[str] = []
    rows = table({
        ("map, 1 instance", "onceflow"): {"records/s": 3000.0},
        ("map, 1 instance", "quix"): {"records/s": 1500.0},
        ("latency", "onceflow"): {"p50": 100.0},
        ("latency", "quix"): {"p50": 300.0},
        ("restore", "onceflow"): {"cold s": 10.0},
        ("broken", "quix"): {"error": "RuntimeError: boom"},
    }, lines.append)
    ratios = {(r["scenario"], r["metric"]): r.get("ours_over_quix") for r in rows}
    assert ratios[("map, 1 instance", "records/s")] == 2.0
    assert ratios[("latency", "p50")] == 3.0
    assert ratios[("restore", "cold s")] is None
    assert any(r.get("error") == "RuntimeError: boom" for r in rows)
    assert any("boom" in line for line in lines)
