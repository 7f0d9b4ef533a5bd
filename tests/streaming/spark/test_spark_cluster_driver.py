"""The sink's driver SIGKILLed on the Spark standalone cluster (conftest's
``spark_cluster``), its executors on the cluster's workers.

The query is test_spark_sink_crash.py's (spark_sink_driver.py: topic
``input`` to ``output``, 20 offsets per microbatch), run as a driver
process of its own against the cluster's master. It is SIGKILLed as a
process group right after writing the decision of its second batch, so
that batch's transactions are decided and open; the master then ends the
dead application's executors. The restarted driver gets new executors,
finishes the decided batch from its decision and goes on: every input
record is in the output exactly once, a read_committed reader running
throughout saw nothing uncommitted or aborted, and no transaction is left
open. (This module starts its own drivers: it holds no SparkSession, whose
executors would take the cluster's cores.)
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from sink_crash_harness import Driver, Reader, assert_exactly_once, open_transactions, produce_input

pytestmark = pytest.mark.slow


@pytest.fixture
def broker(broker_process):
    return broker_process("transaction.abort.timed.out.transaction.cleanup.interval.ms=500")


def test_a_driver_killed_after_its_decision_restarts_exactly_once_on_the_cluster(spark_cluster, broker, tmp_path, monkeypatch):
    from streaming.spark import cluster

    monkeypatch.setenv("SPARK_SINK_MASTER", spark_cluster.master_url)
    # The crash hook's module (spark_sink_driver, beside this file) for every
    # executor's Python workers through the application itself, not only
    # through the cluster workers' environment (CI once saw a restarted
    # driver's executor without it).
    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("SPARK_SINK_CONFIG", json.dumps({**spark_cluster.session_config(), "spark.executorEnv.PYTHONPATH": here}))
    inputs = produce_input(broker.bootstrap, 100)
    reader = Reader(broker.bootstrap)
    reader.start()
    driver = Driver(broker.bootstrap, tmp_path)
    checkpoint, prefix = str(tmp_path / "checkpoint"), "clusterdriver"
    code, log, fired = driver.run(checkpoint, prefix, 2, "spark_sink.after_decision@2:kill")
    assert fired == "spark_sink.after_decision@2:kill" and code == -signal.SIGKILL, log[-3000:]
    assert open_transactions(broker.bootstrap, prefix), "the decided batch's transactions should be open after the kill"
    code, log, fired = driver.run(checkpoint, prefix, 2)
    assert code == 0 and "DONE" in log, log[-3000:]
    reader.stopping.set()
    reader.join(30)
    assert reader.error is None, reader.error
    assert reader.seen, "the reader ran throughout but saw nothing"
    assert_exactly_once(broker.bootstrap, reader, inputs)
    assert open_transactions(broker.bootstrap, prefix) == []
    # The drivers' executors (and their Python workers) end with their applications: only the daemons stay.
    deadline = time.monotonic() + 60
    while len(cluster.processes_of(spark_cluster.directory)) > 1 + spark_cluster.settings.workers:
        assert time.monotonic() < deadline, f"executors of stopped drivers still run: {cluster.processes_of(spark_cluster.directory)}"
        time.sleep(0.5)
