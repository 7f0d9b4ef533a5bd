"""Test your own stream processor under crashes, the way onceflow tests its own.

    python -m pytest examples/chaos_test_of_my_processor.py     (or run it as a script)

The harness starts a broker behind a fault proxy, seeds an ``input`` topic,
runs two copies of your processor, and for the run's duration kills them,
kills and restarts the broker, cuts connections and tears the broker's
writes, on a schedule fixed by the seed. Then it reads ``output`` and checks
that every input record came out exactly once (through your transform).

Your processor is any program; the command template gets ``{bootstrap}``,
``{input}``, ``{output}`` and ``{index}`` (which copy it is). Here it is
onceflow's transactional copier; put yours in its place.
"""

from __future__ import annotations

import os
import sys

from faults.chaos import ChaosSettings, run_as_script, run_chaos

HERE = os.path.dirname(os.path.abspath(__file__))
MY_PROCESSOR = (
    sys.executable, os.path.join(HERE, "txn_copier.py"),
    "--bootstrap", "{bootstrap}", "--input", "{input}", "--output", "{output}",
    "--group", "my-processors", "--transactional-id", "my-processor-{index}",
    "--session-timeout-ms", "6000", "--records-per-txn", "300",
)


def identity(value: str) -> str:
    """What the output should hold for each input value (the copier copies)."""
    return value


def check_my_processor(report_dir: str, *, seed: int = 11, duration: float = 20.0):
    settings = ChaosSettings(
        workload="processor",
        processor=MY_PROCESSOR,
        transform=identity,
        faults=("kill-client", "kill-broker", "proxy-cut", "torn-tail"),
        duration=duration,
        seed=seed,
        records=3000,
        mean_fault_interval=4.0,
    )
    return run_chaos(settings, report_dir)


def test_my_processor_is_exactly_once_under_crashes(tmp_path):
    verdict = check_my_processor(str(tmp_path / "report"))
    assert verdict.valid, verdict.summary()


if __name__ == "__main__":
    sys.exit(run_as_script(check_my_processor, "my-processor-chaos-"))
