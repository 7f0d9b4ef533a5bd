"""Test your own Spark Structured Streaming query under crashes, the way
onceflow tests its own.

    python -m pytest examples/chaos_test_of_my_spark_query.py     (or run it as a script)

The harness starts a broker behind a fault proxy, creates your module's
topics, runs your query in a Spark driver process of its own (local mode),
feeds it your module's input while it SIGKILLs the driver with its JVM and
Python workers (the query restarts from its checkpoint), kills and restarts
the broker and cuts connections, on a schedule fixed by the seed. Then it
reads your output topic read_committed and checks that it holds exactly
what your module's ``expected`` says, each record once.

Your query module needs ``build(spark, bootstrap, checkpoint)`` (start the
query through ``format("onceflow")`` and return it), ``CHAOS_TOPICS``,
``CHAOS_OUTPUT``, ``chaos_input(count, seed)`` and ``expected(records)``
(the convention is in ``faults.spark``). Here it is onceflow's
``examples/spark_region_totals.py``; put yours in its place. Spark needs
Java 17 or newer; a run takes two to four minutes (JVM starts).
"""

from __future__ import annotations

import os
import sys

from faults.chaos import ChaosSettings, run_as_script, run_chaos

HERE = os.path.dirname(os.path.abspath(__file__))
MY_QUERY = os.path.join(HERE, "spark_region_totals.py")


def check_my_query(report_dir: str, *, seed: int = 1, duration: float = 60.0):
    settings = ChaosSettings(
        workload="spark",
        query=MY_QUERY,
        faults=("kill-driver", "kill-broker", "proxy-cut"),
        duration=duration,
        seed=seed,
        records=3000,
        mean_fault_interval=20.0,  # a driver kill costs a JVM start: leave the query time to make progress between faults
    )
    return run_chaos(settings, report_dir)


def test_my_spark_query_is_exactly_once_under_crashes(tmp_path):
    verdict = check_my_query(str(tmp_path / "report"))
    assert verdict.valid, verdict.summary()


if __name__ == "__main__":
    sys.exit(run_as_script(check_my_query, "my-spark-query-chaos-"))
