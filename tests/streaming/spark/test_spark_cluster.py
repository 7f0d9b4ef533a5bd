"""The onceflow source and exactly-once sink on a real Spark standalone
cluster (conftest's ``spark_cluster``: a master and two workers, each
worker's executor a JVM of its own with its own Python workers), driven by
one SparkSession in this process for the whole module.

A streaming query reads topic ``input`` through ``format("onceflow")``,
repartitions it (a shuffle between the executors) and writes ``output``
through the sink: the sink's tasks run in the executors' Python workers
(the crash point hook records where), with pickled copies of the writer,
and the driver's commit decides their transactions. Then a worker is
SIGKILLed with its executor and Python workers while a task holds its
transaction open mid-write: Spark reruns the task on the other executor,
the driver decides the rerun's transaction and aborts the dead one's, and a
read_committed reader running throughout never sees a record that is not
in the final output at the same offset.
"""

from __future__ import annotations

import os
import re
import sys
import time

import pytest

from sink_crash_harness import OUTPUT_PARTITIONS, Reader, assert_exactly_once, open_transactions, produce_input
from txn import Admin, TopicPartition

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
HOOK = "spark_cluster_hook:hold_first_task"
INPUTS = 300


@pytest.fixture(scope="module")
def hook_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cluster-hook")


@pytest.fixture(scope="module")
def cluster_spark(spark_cluster, hook_dir, tmp_path_factory):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import streaming.spark
    from streaming.spark.cluster import wait_for_executors

    config = {
        **spark_cluster.session_config(),
        "spark.executorEnv.CLUSTER_HOOK_DIR": str(hook_dir),
        # The hook module's directory, for the executors' Python workers and the
        # driver's (the driver's commit runs the hook too). Spark hands executorEnv
        # to every Python worker of the data source, the driver's included; the
        # process's own PYTHONPATH would not do, since the JVM keeps the
        # environment of its first session in this process.
        "spark.executorEnv.PYTHONPATH": HERE,
        "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("cluster-warehouse")),
        "spark.sql.streaming.stopTimeout": "30s",
    }
    session = streaming.spark.local_session("onceflow-cluster-tests", master=spark_cluster.master_url, config=config)
    try:
        wait_for_executors(session, spark_cluster.settings.workers)
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()


@pytest.fixture
def broker(broker_process):
    return broker_process("transaction.abort.timed.out.transaction.cleanup.interval.ms=500")


def start_query(spark, bootstrap: str, checkpoint: str, prefix: str):
    events = (
        spark.readStream.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", "input")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 100)
        .load()
    )
    return (
        events.selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")
        .repartition(2)
        .writeStream.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", "output")
        .option("transactionalIdPrefix", prefix)
        .option("crashPointHook", HOOK)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )


def passes(hook_dir) -> list[tuple[int, str, str]]:
    """(pid, cluster role, python) of every task that passed the executor's crash point."""
    path = hook_dir / "passes"
    if not path.exists():
        return []
    return [(int(pid), role, python) for pid, role, python in (line.split(" ", 2) for line in path.read_text().splitlines())]


def task_transactional_ids(bootstrap: str, prefix: str) -> list[str]:
    with Admin(bootstrap) as admin:
        return [t.transactional_id for t in admin.list_transactions() if t.transactional_id.startswith(prefix + "-") and not t.transactional_id.endswith("driver")]


def uncommitted_records(bootstrap: str) -> int:
    """Records of ``output`` past its last stable offset (written in open transactions)."""
    partitions = {TopicPartition("output", p): "latest" for p in range(OUTPUT_PARTITIONS)}
    with Admin(bootstrap) as admin:
        ends = admin.list_offsets(partitions, isolation_level="read_uncommitted")
        stable = admin.list_offsets(partitions, isolation_level="read_committed")
    return sum(ends[tp].offset - stable[tp].offset for tp in partitions)


def finish(reader: Reader) -> None:
    reader.stopping.set()
    reader.join(30)
    assert reader.error is None, reader.error
    assert reader.seen, "the reader ran throughout but saw nothing"


def test_a_query_on_the_cluster_reads_and_writes_exactly_once(cluster_spark, spark_cluster, broker, hook_dir, tmp_path):
    inputs = produce_input(broker.bootstrap, INPUTS)
    reader = Reader(broker.bootstrap)
    reader.start()
    query = start_query(cluster_spark, broker.bootstrap, str(tmp_path / "checkpoint"), "clusterjob")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    finish(reader)
    assert_exactly_once(broker.bootstrap, reader, inputs)
    assert open_transactions(broker.bootstrap, "clusterjob") == []
    # The writes ran in the executors' Python workers (the cluster's mark, this venv's python), never in the driver.
    ran = passes(hook_dir)
    assert ran and {role for _, role, _ in ran} <= set(spark_cluster.worker_roles()), ran
    assert {python for _, _, python in ran} == {sys.executable}
    # Every task's transactional id carries Spark's taskAttemptId, unique across the executors.
    names = task_transactional_ids(broker.bootstrap, "clusterjob")
    assert names and all(re.search(r"-t\d+$", name) for name in names), names


def wait_for_file(path, timeout: float, query) -> str:
    """``path``'s text once it appears; a query that stops first fails the
    wait at once, with the query's error (a Python worker that could not
    connect back in Spark's 10 s on a loaded machine is then seen, and the
    test rerun, as for that error anywhere)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if not query.isActive:
            raise AssertionError(f"the query stopped before {path.name} appeared: {query.exception()}")
        assert time.monotonic() < deadline, f"{path.name} did not appear in {timeout:.0f} s"
        time.sleep(0.2)
    return path.read_text()


def test_a_worker_killed_mid_batch_loses_and_duplicates_nothing(cluster_spark, spark_cluster, broker, hook_dir, tmp_path):
    from streaming.spark import cluster

    inputs = produce_input(broker.bootstrap, INPUTS)
    reader = Reader(broker.bootstrap)
    reader.start()
    (hook_dir / "passes").unlink(missing_ok=True)
    (hook_dir / "armed").touch()
    query = start_query(cluster_spark, broker.bootstrap, str(tmp_path / "checkpoint"), "killjob")
    try:
        held_pid, role = wait_for_file(hook_dir / "held", 180, query).split()
        assert role in spark_cluster.worker_roles()
        assert uncommitted_records(broker.bootstrap) > 0, "the held task's rows should be in output, uncommitted"
        killed = cluster.kill_worker(spark_cluster, role)
        assert int(held_pid) in killed and cluster.processes_of(spark_cluster.directory, role) == {}
        killed_at = len(passes(hook_dir))
        query.processAllAvailable()  # Spark reruns the lost tasks on the surviving executor
    finally:
        query.stop()
        for name in ("armed", "held", "held.claim"):
            (hook_dir / name).unlink(missing_ok=True)
    survivor = {r for _, r, _ in passes(hook_dir)[killed_at:]}
    assert survivor and role not in survivor, f"after {role} was killed, tasks ran on {survivor}"
    finish(reader)
    assert_exactly_once(broker.bootstrap, reader, inputs)
    assert open_transactions(broker.bootstrap, "killjob") == []
    cluster.start_worker(spark_cluster, role)  # the cluster whole again for whoever comes next
