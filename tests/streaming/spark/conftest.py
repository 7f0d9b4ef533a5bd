"""A SparkSession shared by the tests of one module (local[2], lean), with
the ``onceflow`` data source registered; and a Spark standalone cluster
shared by the whole session (``spark_cluster``).

Spark's startup costs 5-10 s and about 1 GB, so each test module pays it once
(``spark`` is module-scoped) and stops the session at the end, so the next
module's session starts clean. Spark's Python workers run this interpreter.

``spark_cluster`` (``streaming.spark.cluster``: a master and two workers of
1 core and 1 GiB each, ~30 s to start here) is started by the first test
that asks for it and stopped at the end of the run, which checks that no
process of it is left. Its executors' Python workers run this interpreter
and can import this folder's helper modules (the crash point hooks).
"""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    pytest.importorskip("pyspark.sql")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import streaming.spark

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = streaming.spark.local_session(
        "onceflow-tests", config={"spark.sql.warehouse.dir": str(warehouse), "spark.sql.streaming.stopTimeout": "30s"}
    )
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()


HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    pytest.importorskip("pyspark.sql")
    from faults.process import REPO
    from streaming.spark import cluster

    directory = str(tmp_path_factory.mktemp("spark-cluster"))
    python_path = os.pathsep.join(p for p in (REPO, HERE, os.environ.get("PYTHONPATH")) if p)
    started = cluster.start(directory, cluster.ClusterSettings(python=sys.executable), env={"PYTHONPATH": python_path})
    try:
        yield started
    finally:
        cluster.stop(directory)
        assert cluster.processes_of(directory) == {}, "a process of the Spark cluster outlived its stop"
