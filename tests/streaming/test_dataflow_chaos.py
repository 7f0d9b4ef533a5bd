"""The examples under ``onceflow chaos --workload streaming``: two instances
of each (real processes, one state directory each), SIGKILLed and restarted
several times (and the broker with them), their output checked against the
module's ``expected`` by faults.checker; and the check itself, shown failing."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from faults.chaos import ChaosSettings, run_chaos
from faults.checker import check_workload
from faults.process import REPO
from faults.workloads import load_app_module, output_text


def test_output_text_compares_json_values_whatever_their_spelling():
    assert output_text(b"k", b'{"b": 2, "a": 1}') == output_text("k", '{"a":1,"b":2}') == '["k",{"a":1,"b":2}]'
    assert output_text(None, b"plain text") == '[null,"plain text"]'


def test_the_streaming_check_reports_missing_duplicate_and_unexpected_outputs():
    expected = Counter({output_text("a", "1"): 1, output_text("b", "2"): 2, output_text("c", "3"): 1})

    def reads(*values):
        return [{"time": 1.0 + i, "process": "final-reader/1", "type": "ok", "op": "poll",
                 "value": [["poll", {"out-0": [[i, v]]}]]} for i, v in enumerate(values)]

    exact = check_workload("streaming", reads(output_text("a", "1"), output_text("b", "2"), output_text("b", "2"), output_text("c", "3")),
                           expected_outputs=expected, output_topic="out")
    assert exact.valid, exact.summary()
    wrong = check_workload("streaming", reads(output_text("a", "1"), output_text("a", "1"), output_text("b", "2"), output_text("d", "4")),
                           expected_outputs=expected, output_topic="out")
    assert wrong.anomaly_counts == {"copy-duplicate": 1, "copy-missing": 2, "copy-unexpected": 1}


def test_a_module_without_the_convention_is_refused_by_name(tmp_path):
    module = tmp_path / "bare_app.py"
    module.write_text("def build_app(bootstrap_servers, state_dir):\n    pass\n")
    with pytest.raises(LookupError, match="CHAOS_TOPICS, CHAOS_OUTPUT, chaos_input, expected"):
        load_app_module(str(module))
    with pytest.raises(ValueError, match="app module"):
        ChaosSettings(workload="streaming")


@pytest.mark.slow
@pytest.mark.parametrize("example, faults, records", [
    ("word_count.py", ("kill-client", "kill-broker"), 2500),
    ("enrichment.py", ("kill-client", "kill-broker", "pause-broker", "proxy-cut"), 2000),
    # Session and sliding windows and a stream-time timer (examples/sessions.py recomputes its output from the input).
    ("sessions.py", ("kill-client", "kill-broker"), 2000),
    # A windowed stream-stream join (its expected pairs recomputed from the input).
    ("click_attribution.py", ("kill-client", "kill-broker"), 1500),
])
def test_each_example_is_exactly_once_while_instances_are_killed(tmp_path, example, faults, records):
    settings = ChaosSettings(workload="streaming", app=os.path.join(REPO, "examples", example), faults=faults, duration=16.0,
                             seed=3, records=records, clients=2, mean_fault_interval=2.5)
    verdict = run_chaos(settings, str(tmp_path / "report"))
    assert verdict.valid, verdict.summary()
    injected = [json.loads(line) for line in (tmp_path / "report" / "faults.jsonl").read_text().splitlines()]
    assert sum(1 for fault in injected if fault["kind"] == "kill-client") >= 2 and len(injected) >= 4
    assert verdict.counts["read"] >= {"word_count.py": 20, "sessions.py": 200, "click_attribution.py": 300}.get(example, records)


def test_the_command_line_wants_an_app_module_for_the_streaming_workload(capsys):
    from onceflow.cli import main

    assert main(["chaos", "--workload", "streaming", "--faults", "kill-client", "--report", "unused"]) == 2
    assert "app module" in capsys.readouterr().err
